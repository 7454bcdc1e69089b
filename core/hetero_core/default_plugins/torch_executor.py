"""The built-in torch executor: runs a Llama-family model with the torch paged attention backend.

Only its factory imports this module, so torch loads only when this executor is selected.
Per step it builds every tensor (token ids, positions, attention metadata, sample rows) once,
runs the model under ``torch.inference_mode()`` and returns fp32 logits (on its device) for the sampled rows.
On CPU the linears run through oneDNN with weights packed once at load (``cpu_linear``; option
``prepack_weights``). ``dtype = "auto"`` (the default) is bf16 where the CPU computes it natively
(``compute_dtype``).
"""

from __future__ import annotations

import dataclasses

import torch

from hetero_core.default_plugins.torch_options import TorchExecutorOptions
from hetero_core.engine.batch import Batch, ExecutorOutput
from hetero_core.errors import ConfigError, ModelLoadError
from hetero_core.executor import ExecutorContext
from hetero_core.logging import get_logger
from hetero_core.model.cpu.compute_dtype import resolve_dtype
from hetero_core.model.cpu.linear import PackedLinear, can_pack
from hetero_core.model.cpu.threads import FreeCpuThreads, intra_op_threads
from hetero_core.model.cpu.fused_decode import FusedDecode
from hetero_core.model.layers import use_cpu_kernels
from hetero_core.cache.cache_dir import default_cache_dir
from hetero_core.model.loader import load_model
from hetero_core.model.cpu.prepared_weights import load_packed_model, pack_model
from hetero_core.model.tensor_parallel import placement as tensor_parallel_placement
from hetero_core.model.cpu.torch_attention import TorchPagedAttention

__all__ = ["TorchExecutor", "TorchExecutorOptions"]

log = get_logger("hetero.executor")


class TorchExecutor:
    """Owns the model and its paged KV cache (``num_layers`` x K/V in the backend's layout, blocks
    along its ``kv_block_dim``); ``execute(batch)`` returns logits rows in ``batch.sample_indices`` order."""

    def __init__(self, ctx: ExecutorContext, backend=None, options: TorchExecutorOptions | None = None):
        """``backend``: the attention backend (default: the torch paged reference). GPU executor
        plugins reuse this class with their own backend and an options model with the same fields
        (``device``, ``dtype``, ``num_threads``, ``prepack_weights``)."""
        options = options or (ctx.options if ctx.options is not None else TorchExecutorOptions())
        if ctx.model_dir is None:
            raise ModelLoadError("the torch executor needs a model; set `model` to an HF directory or .gguf file")
        # Tensor parallelism (tensor_parallel_size > 1): this rank's shard and device.
        shard, self.device = tensor_parallel_placement(ctx, _device(options.device))
        self._free_cpu_threads = None  # threads that follow the CPUs other processes leave free
        if self.device.type == "cpu" or options.num_threads is not None:
            threads = intra_op_threads(options.num_threads, ctx.tensor_parallel_size)
            torch.set_num_threads(threads)
            if self.device.type == "cpu" and options.num_threads is None and ctx.tensor_parallel_size == 1:
                self._free_cpu_threads = FreeCpuThreads(threads, _set_threads)
        self.dtype = resolve_dtype(options.dtype, self.device)
        log.info("executor.dtype", requested=options.dtype, dtype=str(self.dtype).removeprefix("torch."))
        self.block_size = ctx.block_size
        self.backend = backend if backend is not None else _cpu_backend(options, self.device)
        kernels = getattr(self.backend, "cpu_kernels", None) if self.device.type == "cpu" else None
        if kernels is not None and not options.block_code_weights:
            kernels = dataclasses.replace(kernels, block_codes=False)
        pack = options.prepack_weights and can_pack(self.device, self.dtype, kernels)
        if pack and shard is None and options.prepared_weights_cache:
            cache_dir = ctx.settings.cache_dir if ctx.settings is not None else None
            self.model = load_packed_model(ctx.model_dir, cache_dir or default_cache_dir(), backend=self.backend,
                                           dtype=self.dtype, kernels=kernels)
        else:
            self.model = load_model(ctx.model_dir, backend=self.backend, device=self.device, dtype=self.dtype,
                                    tensor_parallel=shard)
            if pack:
                pack_model(self.model, kernels)
        if pack:
            for module in self.model.lm_head.modules():  # the head, or its packed linear under tensor parallelism
                if isinstance(module, PackedLinear):
                    module.float32_output = True  # logits in fp32 straight from the matmul
        if kernels is not None:
            use_cpu_kernels(self.model, kernels)  # fused element-wise steps
        config = self.model.config
        self.kv_caches = self.backend.allocate_kv_cache(
            num_layers=config.num_hidden_layers,
            num_blocks=ctx.num_blocks,
            block_size=ctx.block_size,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        if kernels is not None and pack and options.fused_decode and shard is None:
            self.model.fused_decode = FusedDecode.for_model(self.model, kernels, self.kv_caches)
            log.info("executor.fused_decode", applies=self.model.fused_decode is not None)
        self.block_dim = getattr(self.backend, "kv_block_dim", 0)
        self.num_swap_blocks = getattr(ctx, "num_swap_blocks", 0)
        self._swap = self._allocate_swap_space() if self.num_swap_blocks else None  # swap preemption

    @property
    def vocab_size(self) -> int:
        """Width of the logits rows (the model's vocabulary, which may exceed the tokenizer's)."""
        return self.model.config.vocab_size

    @property
    def eos_token_id(self) -> int | None:
        return self.model.config.eos_token_id

    def execute(self, batch: Batch) -> ExecutorOutput:
        if batch.block_size != self.block_size:
            raise ValueError(f"batch block_size {batch.block_size} != executor block_size {self.block_size}")
        if self._free_cpu_threads is not None:
            self._free_cpu_threads.update()
        with torch.inference_mode():
            input_ids = torch.tensor(batch.token_ids, dtype=torch.long).to(self.device, non_blocking=True)
            positions = torch.tensor(batch.positions, dtype=torch.long).to(self.device, non_blocking=True)
            metadata = self.backend.build_metadata(batch, self.device)
            rows = [batch.query_start_loc[i + 1] - 1 for i in batch.sample_indices]
            logits = self.model.sampled_logits(input_ids, positions, metadata, self.kv_caches, rows)
            # fp32 rows on the executor's device: the sampler runs where they are (no copy of
            # [rows, vocab] logits to the host each step on a GPU).
            return ExecutorOutput(logits=logits.float())

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks within the cache (copy-on-write): ``(source, destination)`` pairs."""
        source, destination = self._block_index(pairs, self.device)
        with torch.inference_mode():
            for cache in self.kv_caches:
                for tensor in cache:
                    tensor.index_copy_(self.block_dim, destination, tensor.index_select(self.block_dim, source))

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Copy KV blocks to the CPU swap space: ``(device block, swap block)`` pairs."""
        source, _ = self._block_index(pairs, self.device)
        _, destination = self._block_index(pairs, torch.device("cpu"))
        with torch.inference_mode():
            for cache, swap in zip(self.kv_caches, self._swap_space()):
                for tensor, swapped in zip(cache, swap):
                    swapped.index_copy_(self.block_dim, destination, tensor.index_select(self.block_dim, source).cpu())

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """Copy KV blocks back from the CPU swap space: ``(swap block, device block)`` pairs."""
        source, _ = self._block_index(pairs, torch.device("cpu"))
        _, destination = self._block_index(pairs, self.device)
        with torch.inference_mode():
            for cache, swap in zip(self.kv_caches, self._swap_space()):
                for tensor, swapped in zip(cache, swap):
                    blocks = swapped.index_select(self.block_dim, source).to(self.device)
                    tensor.index_copy_(self.block_dim, destination, blocks)

    def _swap_space(self) -> list:
        if self._swap is None:
            raise ValueError("swap requested but the executor was built with num_swap_blocks = 0")
        return self._swap

    def _allocate_swap_space(self) -> list:
        """CPU tensors in the cache's layout with ``num_swap_blocks`` blocks, one tuple per layer."""
        pin = self.device.type == "cuda"

        def swap_like(tensor: torch.Tensor) -> torch.Tensor:
            shape = list(tensor.shape)
            shape[self.block_dim] = self.num_swap_blocks
            return torch.zeros(shape, dtype=tensor.dtype, pin_memory=pin)

        return [tuple(swap_like(t) for t in cache) for cache in self.kv_caches]

    @staticmethod
    def _block_index(pairs, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)
        return index[:, 0].to(device), index[:, 1].to(device)

    def shutdown(self) -> None:
        self._swap = None
        self.kv_caches = []
        self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _set_threads(threads: int) -> None:
    log.info("executor.cpu_threads", threads=threads, reason="CPUs left free by other processes")
    torch.set_num_threads(threads)


def _device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"executor.torch.device: invalid device {name!r}; use e.g. 'cpu' or 'cuda:0'") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"executor.torch.device is {name!r} but this torch build sees no CUDA device; use device = 'cpu'"
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"executor.torch.device is {name!r} but MPS is not available; use device = 'cpu'")
    return device


def _cpu_backend(options: TorchExecutorOptions, device: torch.device) -> TorchPagedAttention:
    """The torch paged backend, with the compiled CPU kernels where ``cpu_kernels`` allows them."""
    if options.cpu_kernels == "torch" or device.type != "cpu":
        return TorchPagedAttention()
    from hetero_core.model.cpu.kernels import KernelUnavailable, load_cpu_kernels

    try:
        return TorchPagedAttention(cpu_kernels=load_cpu_kernels(required=options.cpu_kernels == "compiled"))
    except KernelUnavailable as exc:
        raise ConfigError(f"[executor.torch] cpu_kernels = \"compiled\": {exc}; use \"auto\" or \"torch\"") from None
