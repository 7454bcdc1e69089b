"""The CPU runtime of the torch executor: the C kernels (``csrc/``, built and loaded by ``kernels``), the
linears over packed or block-code weights (``linear``, ``kernel_linears``, ``block_codes``), the paged
attention backend (``torch_attention``), the fused decode step (``fused_decode``), the prepared-weights
cache (``prepared_weights``), the compute dtype and the CPU it runs on (``compute_dtype``,
``bf16_speed``), and the OpenMP threads (``threads``)."""
