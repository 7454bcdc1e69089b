"""Options of the built-in torch executor (section ``[executor.torch]``); imports no torch."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TorchExecutorOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device: str = Field("cpu", description="torch device to run on, e.g. 'cpu' or 'cuda:0'")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="weights, activations and KV cache dtype; auto on the CPU: float32, or bfloat16 (and "
        "bfloat16 on AMX tiles, amx_linears) where the CPU computes bf16 natively (avx512_bf16 or "
        "amx_bf16), or where fp32 does not fit and the compiled kernels run bf16 weights (widened to "
        "fp32), and timed steps of the model's first layers (a prefill, a batched and a single "
        "decode on 1- and 3-layer models of the checkpoint, extrapolated to all its layers, in each "
        "candidate; once per CPU, model and version, kept in <cache_dir>/cpu_dtype_choice.json) show "
        "it at least 3% faster on a reference workload; a candidate whose weights do not fit in the "
        "memory available (cgroup limit included) is skipped, none fitting is an error naming the "
        "options that make the model smaller; the -v line executor.dtype gives the "
        "figures; tensor-parallel ranks: bfloat16 where a bf16 matmul is 1.2x fp32's (timed once per "
        "CPU, <cache_dir>/cpu_dtype_speed.json); bfloat16 on a bf16-capable CUDA device, float16 on others",
    )
    num_threads: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="torch intra-op threads on the CPU, fixed; default: the CPUs this process may use "
        "(its affinity mask, os.sched_getaffinity), fewer while other processes keep some of them busy "
        "(re-measured every 0.25 s from /proc/stat)",
    )
    prepack_weights: bool = Field(
        True,
        description="on CPU (float32, bfloat16): run linears on weights packed once at load, in the "
        "layout of the compiled kernels' own linear (fp32 and bf16 on any CPU, for every batch size: "
        "batch-invariant; 1.1-2x oneDNN at decode batch sizes) or else in oneDNN's (fp32: 2-3x "
        "faster than MKL's sgemm on AMD CPUs); false: plain torch.nn.functional.linear",
    )
    block_code_weights: bool = Field(
        True,
        description="on the CPU with the compiled kernels: a GGUF's linears load from its codes (Q4_0, "
        "Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; other types dequantized) and run them in "
        "float32 and bfloat16 alike (dtype picks activations and attention), 0.59-1.25 bytes a weight, "
        "never the model's fp32 weights; an fp32 checkpoint whose weights are exact Q4_1/Q8_0 codes "
        "streams them too; with code_activations = float the same results bit for bit as the fp32 weights; "
        "false: weights in dtype",
    )
    code_activations: Literal["int8", "float"] = Field(
        "float",
        description="with block_code_weights: how the code linears take their activations. float (the "
        "default): the codes expanded to fp32 against fp32 activations, bit-identical to the dequantized "
        "fp32 weights, so greedy output stays the fp32 (and HF) model's. int8 (opt-in): perplexity within "
        "1% of float's (the embedded model: 16.74 against 16.62; llama.cpp 16.86 on the same file), "
        "but greedy answers can differ from the fp32 model's from their first token: each "
        "row quantized to int8 per block of 32 inputs (scale max|x| / 127, as llama.cpp's Q8_0) and the "
        "products with the codes summed exactly in integers (AVX-512 VNNI, or AVX2), the block scales "
        "applied in a fixed order: batch-invariant, 2-3x faster than float at batched decode steps, "
        "within a few 2^-8 of each block's largest activation of the fp32 result (CPUs with neither "
        "instruction set run float)",
    )
    fused_decode: bool = Field(
        True,
        description="on the CPU with the compiled kernels and every linear in their layout (float32, "
        "bfloat16), one process (no tensor parallelism): a step whose every token "
        "is a decode runs all decoder layers in one kernel call (the same kernels in "
        "the same order, bit-identical results) instead of ~8 Python-level calls per layer (~3-4 ms "
        "less per step on SmolLM2's 30 layers); false: always the layer-by-layer model code",
    )
    amx_linears: bool = Field(
        True,
        description="on the CPU in bfloat16 with the compiled kernels: where the CPU has AMX (amx_tile, "
        "amx_bf16 in /proc/cpuinfo) and Linux grants the tiles (arch_prctl), run the bf16 linears on AMX "
        "tiles (a variant of the kernels library, self-checked against torch at load; a failure is one "
        "warning and the AVX-512 linears); with dtype = auto it is a candidate of its own, timed; and, "
        "with code_activations = int8, in any dtype where the CPU has amx_int8: the block-code linears' "
        "integer sums of steps of 16 rows or more on AMX-INT8 tiles (the same bits as the VNNI path, "
        "self-checked against it); false: never",
    )
    prepared_weights_cache: bool = Field(
        True,
        description="on the CPU with prepack_weights: keep the weights as this executor runs them "
        "(converted to dtype, q/k/v and gate/up fused, packed) in <cache_dir>/prepared (at most 4 "
        "files, the least recently used deleted first) and memory-map them at later starts instead "
        "of converting and packing again (about 0.3 s less for SmolLM2-135M in bf16; the file is "
        "model-sized); false: convert and pack at every start, write nothing",
    )
    cuda_graphs: bool = Field(
        False,
        description="on a CUDA device, one process: replay pure decode steps from CUDA graphs captured at "
        "start-up (batch sizes 1, 2, 4, 8, then every 16 up to max_num_seqs; a step is padded up to the "
        "next, on one extra scratch KV block) over a static block table max_model_len wide, so each "
        "decode gathers every sequence's pages to that width where an eager step gathers to its longest "
        "context: it pays where max_model_len is short or kernel launches dominate; false: eager steps "
        "(the CPU always runs them)",
    )
    quantization: Literal["int8", "w8a8"] | None = Field(
        None,
        description="on the CPU, one process: int8: the linears' weights as int8 codes per output channel "
        "(symmetric, fp32 scales; half of bf16's bytes), activations in dtype; w8a8: the activations "
        "quantized to int8 per token too and summed in int32 (AVX-512 VNNI where the CPU has it), the "
        "LM head weight-only int8; quantized from the checkpoint a layer at a time as it loads (the "
        "embedded GGUF's Q4 codes dequantized first; peak memory the int8 model and one layer), saved to "
        "a prepared-weights file of its own (prepared_weights_cache) and mapped from it at later starts; "
        "no fused decode step; dtype auto becomes "
        "bfloat16 where the CPU computes it natively, else float32; None: the weights in dtype",
    )
    quantization_group_size: int = Field(
        32,
        ge=0,
        le=65536,
        description="with quantization: one int8 scale per this many inputs of each output channel (a "
        "multiple of 4 dividing the layer's inputs; a layer it does not divide gets one scale per output "
        "channel); 0: one scale per output channel (the smallest weights, the largest error: on the "
        "embedded model greedy tokens before the first divergence from bf16 fell from 55% to 33% for int8, "
        "37% to 13% for w8a8; docs/benchmarks.md)",
    )
    cpu_kernels: Literal["auto", "compiled", "torch"] = Field(
        "auto",
        description="on the CPU (float32, bfloat16): compiled: C kernels built once with the system C "
        "compiler (cc/gcc, or $CC) and cached, which write K/V and attend decodes and prefills straight "
        "on the paged cache, fuse the element-wise steps (residual add + RMSNorm, SiLU-and-multiply, "
        "RoPE) and run the packed linears (prepack_weights), batch-invariant (a sequence's logits do "
        "not depend on chunking, batch-mates or preemption); torch: pure torch ops (gathered blocks, "
        "SDPA per prompt, eager element-wise ops; not batch-invariant); auto: compiled where the "
        "kernels build, torch otherwise",
    )
