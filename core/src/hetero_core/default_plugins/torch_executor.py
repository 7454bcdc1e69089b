"""The built-in torch executor: core's model code on the torch paged attention backend, with the CPU
runtime (``hetero_core.model.cpu``) around it.

Only its factory imports this module, so torch loads only when this executor is selected (the
factory first chooses OpenMP's wait policy on the CPU: ``model/cpu/threads.py``). The step itself is
core's ``ModelRunner``; this class adds the CPU's concerns: intra-op threads that follow the free
CPUs, linears on weights packed once at load (``cpu.linear``; option ``prepack_weights``) and kept in
the prepared-weights cache, the compiled kernels, and the fused decode step. ``dtype = "auto"`` (the
default) on the CPU is the candidate (fp32, bf16, bf16 on AMX tiles) that timed steps of the model
itself show faster (``torch_auto_dtype``); an explicit bf16 runs its linears on AMX tiles where the
CPU has them and they pass their gate (``cpu.amx``); with ``code_activations = "int8"`` the block-code
linears' integer sums run on AMX-INT8 tiles for steps of many rows, whatever the dtype
(``cpu.amx_int8``: the same bits as the vector path). On the CPU the memory this process may take is
read before any weight loads (``torch_memory``): ``auto`` skips the candidates that do not fit, and
without ``max_num_blocks`` the KV pool is sized from what the weights leave.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from hetero_core.cache.cache_dir import default_cache_dir
from hetero_core.default_plugins.torch_auto_dtype import choose_auto_dtype
from hetero_core.default_plugins.torch_memory import kv_pool, memory_fit
from hetero_core.default_plugins.torch_options import TorchExecutorOptions
from hetero_core.engine.scheduling.batch import Batch, ExecutorOutput
from hetero_core.errors import ConfigError, ModelLoadError
from hetero_core.executor import ExecutorContext
from hetero_core.logging import get_logger
from hetero_core.model.config import ModelConfig
from hetero_core.model.cpu.amx import amx_kernels
from hetero_core.model.cpu.amx_int8 import int8_code_tiles
from hetero_core.model.cpu.compute_dtype import cpu_has_native_bf16, resolve_dtype
from hetero_core.model.cpu.fused_decode import FusedDecode
from hetero_core.model.cpu.gguf_codes_loader import codes_source, load_codes_model
from hetero_core.model.cpu.int8_linear import Int8Linear, Quantization, linear_weight_bytes
from hetero_core.model.cpu.linear import PackedLinear, can_pack
from hetero_core.model.cpu.prepared_weights import load_packed_model, pack_model
from hetero_core.model.cpu.probe_model import first_layers
from hetero_core.model.cpu.threads import FreeCpuThreads, intra_op_threads
from hetero_core.model.cpu.torch_attention import TorchPagedAttention
from hetero_core.model.decode_graphs import build_decode_graphs
from hetero_core.model.layers import use_cpu_kernels
from hetero_core.model.loader import load_model
from hetero_core.model.pipeline_stage import stage_of
from hetero_core.model.runner import ModelRunner
from hetero_core.model.runner_executor import RunnerExecutor
from hetero_core.model.tensor_parallel import placement as tensor_parallel_placement

__all__ = ["TorchExecutor", "TorchExecutorOptions"]

log = get_logger("hetero.executor")


class TorchExecutor(RunnerExecutor):
    """Owns a ``ModelRunner`` (the model and its paged KV cache, ``num_layers`` x K/V in the torch
    backend's head-major layout); ``execute(batch)`` returns logits rows in ``batch.sample_indices`` order."""

    def __init__(self, ctx: ExecutorContext, options: TorchExecutorOptions | None = None):
        options = options or (ctx.options if ctx.options is not None else TorchExecutorOptions())
        if ctx.model_dir is None:
            raise ModelLoadError(
                "the torch executor needs a model; set `model` to an HF directory or .gguf file"
            )
        # Tensor parallelism (tensor_parallel_size > 1): this rank's shard and device; pipeline
        # parallelism (pipeline_parallel_size > 1): this rank's stage (its layers only).
        shard, self.device = tensor_parallel_placement(ctx, _device(options.device))
        stage = None
        if ctx.pipeline_parallel_size > 1:
            stage = stage_of(ctx, ModelConfig.from_dir(ctx.model_dir).num_hidden_layers)
        world = ctx.tensor_parallel_size * ctx.pipeline_parallel_size
        self._free_cpu_threads = None  # threads that follow the CPUs other processes leave free
        if self.device.type == "cpu" or options.num_threads is not None:
            threads = intra_op_threads(options.num_threads, world)
            torch.set_num_threads(threads)
            if self.device.type == "cpu" and options.num_threads is None and world == 1:
                self._free_cpu_threads = FreeCpuThreads(threads, _set_threads)
        self.block_size = ctx.block_size
        cache_dir = (ctx.settings.cache_dir if ctx.settings is not None else None) or default_cache_dir()
        kernels = _cpu_kernels(options, self.device, cache_dir)  # attention, K/V writes, pointwise, linears
        if kernels is not None and not options.block_code_weights:
            kernels = dataclasses.replace(kernels, block_codes=False)
        if kernels is not None and options.code_activations != kernels.code_activations:
            kernels = dataclasses.replace(kernels, code_activations=options.code_activations)
        if kernels is not None and options.amx_linears:  # int8 code sums on AMX-INT8 tiles: the same bits
            kernels = int8_code_tiles(kernels)
        if kernels is not None and options.code_activations == "int8":
            log.info("executor.code_linears", path=kernels.code_linear_path)

        def build(dtype: torch.dtype, kernels, num_blocks: int, block_size: int, num_layers=None, model=None):
            """A runner of its own (a fresh backend: no state shared with another runner); one library
            (``kernels``, the AMX variant included) runs all of its kernels. ``num_layers``: a model of
            the checkpoint's first layers only (``dtype = "auto"``'s probe); ``model``: that model,
            already built and packed (a view of a larger probe model), whose backend it keeps."""
            if model is not None:
                return _runner(
                    ctx, options, model, dtype, kernels, (num_blocks, block_size), world > 1, self.device
                )
            backend = TorchPagedAttention(cpu_kernels=kernels)
            return _build_runner(
                ctx,
                options,
                backend,
                shard,
                self.device,
                dtype,
                kernels,
                (num_blocks, block_size),
                cache_dir,
                num_layers,
                stage,
            )

        on_cpu = self.device.type == "cpu" and world == 1
        fit = memory_fit(ctx, options, kernels) if on_cpu else None  # before any weight is loaded

        if options.quantization is not None and (self.device.type != "cpu" or world > 1):
            raise ConfigError(
                f"[executor.torch] quantization = {options.quantization!r} runs on the CPU in one "
                "process; use device = 'cpu', tensor_parallel_size = 1 and pipeline_parallel_size = 1, "
                "or leave quantization unset"
            )
        if options.dtype == "auto" and options.quantization is not None:
            self.dtype = torch.bfloat16 if cpu_has_native_bf16() else torch.float32
            reason = (
                f"quantization = {options.quantization}: activations in bf16 where the CPU computes it "
                "natively"
            )
        elif options.dtype == "auto" and self.device.type == "cpu" and world == 1:  # timed on the model
            self.dtype, kernels, reason = choose_auto_dtype(
                ctx.model_dir, options, kernels, build, cache_dir, fit
            )
        else:
            self.dtype, reason = resolve_dtype(options.dtype, self.device), "as configured"
            if self.dtype == torch.bfloat16 and kernels is not None and options.amx_linears:
                amx = amx_kernels(kernels)  # None unless the CPU has AMX, granted and self-checked
                if amx is not None:
                    kernels, reason = amx, "as configured; linears on AMX tiles"
        problem = fit.problem(str(self.dtype).removeprefix("torch.")) if fit is not None else None
        if problem is not None and options.dtype != "auto" and options.quantization is None:  # said first
            log.warning("executor.memory_tight", dtype=str(self.dtype).removeprefix("torch."), reason=problem)
        log.info(
            "executor.dtype",
            requested=options.dtype,
            dtype=str(self.dtype).removeprefix("torch."),
            reason=reason,
        )
        graphs = options.cuda_graphs and self.device.type == "cuda" and world == 1
        pool = kv_pool(ctx, fit, self.dtype) if fit is not None else None  # None: ctx.num_blocks exactly
        num_blocks = pool.num_blocks if pool is not None else ctx.num_blocks
        self.runner = build(self.dtype, kernels, num_blocks + graphs, ctx.block_size)  # + graphs' scratch
        if pool is not None:  # the engine's allocator hands out exactly these
            self.capabilities = self.runner_capabilities(num_kv_blocks=num_blocks)
        if graphs:
            self.graph_runner = build_decode_graphs(
                self.runner,
                scratch_block=ctx.num_blocks,
                max_num_seqs=ctx.max_num_seqs,
                max_model_len=ctx.max_model_len,
            )
        if kernels is not None and options.fused_decode and world == 1:
            log.info("executor.fused_decode", applies=self.runner.model.fused_decode is not None)

    @property
    def model(self):
        return self.runner.model

    @property
    def linear_weight_bytes(self) -> int:
        """Bytes of the model's linear weights as they run (packed, int8 codes and scales, or plain)."""
        return linear_weight_bytes(self.model)

    @property
    def backend(self) -> TorchPagedAttention:
        return self.runner.backend

    def execute(self, batch: Batch) -> ExecutorOutput:
        if self._free_cpu_threads is not None:
            self._free_cpu_threads.update()
        return super().execute(batch)  # the runner, or a decode graph (cuda_graphs on a GPU)


def _build_runner(
    ctx: ExecutorContext,
    options: TorchExecutorOptions,
    backend,
    shard,
    device: torch.device,
    dtype: torch.dtype,
    kernels,
    cache_shape: tuple[int, int],
    cache_dir,
    num_layers: int | None = None,
    stage=None,
) -> ModelRunner:
    """The model as this executor runs it in ``dtype`` (packed, and mapped from the prepared-weights
    cache, where it can be; the compiled kernels' fused steps) over a cache of ``cache_shape``'s
    (blocks, block size); ``num_layers``: the checkpoint's first layers only (``probe_model``);
    ``stage``: a pipeline stage's layers only (``pipeline_stage``)."""
    pack = options.prepack_weights and can_pack(device, dtype, kernels)
    gguf = codes_source(ctx.model_dir, dtype, kernels) if pack and device.type == "cpu" else None
    if num_layers is not None and gguf is not None:  # the probe of a GGUF: its codes, never fp32 weights
        model = load_codes_model(
            ctx.model_dir, gguf, backend=backend, dtype=dtype, kernels=kernels, num_layers=num_layers
        )
    elif num_layers is not None:  # dtype = "auto"'s probe: never a prepared file, never quantized
        model = first_layers(ctx.model_dir, num_layers, backend=backend, dtype=dtype)
        if pack:
            pack_model(model, kernels)
    elif options.quantization is not None:  # quantized a layer at a time as it loads (``Quantization``)
        quantization = Quantization(options.quantization, options.quantization_group_size, kernels)
        if pack:  # and saved to (then mapped from) a prepared file of its own
            model = load_packed_model(
                ctx.model_dir,
                cache_dir,
                backend=backend,
                dtype=dtype,
                kernels=kernels,
                prepared_file=options.prepared_weights_cache,
                quantization=quantization,
            )
        else:
            model = load_model(ctx.model_dir, backend=backend, dtype=dtype, on_group=quantization)
    elif pack and shard is None and stage is None and device.type == "cpu":
        model = load_packed_model(
            ctx.model_dir,
            cache_dir,
            backend=backend,
            dtype=dtype,
            kernels=kernels,
            prepared_file=options.prepared_weights_cache,
        )
    else:
        model = load_model(
            ctx.model_dir,
            backend=backend,
            device=device,
            dtype=dtype,
            tensor_parallel=shard,
            pipeline_stage=stage,
        )
        if pack:
            pack_model(model, kernels)
    if (pack or options.quantization is not None) and model.lm_head is not None:  # None: an earlier stage
        for module in model.lm_head.modules():  # the head, or its packed linear under tensor parallelism
            if isinstance(module, (PackedLinear, Int8Linear)):
                module.float32_output = True  # logits in fp32 straight from the matmul
    if kernels is not None:
        use_cpu_kernels(model, kernels)  # fused element-wise steps
    distributed = shard is not None or stage is not None
    return _runner(ctx, options, model, dtype, kernels, cache_shape, distributed, device)


def _runner(ctx, options, model, dtype, kernels, cache_shape, distributed: bool, device) -> ModelRunner:
    """``model`` (built, packed) over a cache of ``cache_shape``'s (blocks, block size), with the fused
    decode step over that cache where it applies (one process only: ``distributed`` False)."""
    num_blocks, block_size = cache_shape
    runner = ModelRunner(
        model,
        num_blocks=num_blocks,
        block_size=block_size,
        dtype=dtype,
        device=device,
        num_swap_blocks=ctx.num_swap_blocks,
    )
    pack = options.prepack_weights and can_pack(device, dtype, kernels)
    if kernels is not None and pack and options.fused_decode and not distributed:
        model.fused_decode = FusedDecode.for_model(model, kernels, runner.kv_caches)
    return runner


def _set_threads(threads: int) -> None:
    log.info("executor.cpu_threads", threads=threads, reason="CPUs left free by other processes")
    torch.set_num_threads(threads)


def _device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(
            f"executor.torch.device: invalid device {name!r}; use e.g. 'cpu' or 'cuda:0'"
        ) from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"executor.torch.device is {name!r} but this torch build sees no CUDA device; use device = 'cpu'"
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"executor.torch.device is {name!r} but MPS is not available; use device = 'cpu'")
    return device


def _cpu_kernels(options: TorchExecutorOptions, device: torch.device, cache_dir: Path):
    """The compiled CPU kernels where ``cpu_kernels`` allows them (None: the torch path), built into
    and found in ``cache_dir``."""
    if options.cpu_kernels == "torch" or device.type != "cpu":
        return None
    from hetero_core.model.cpu.kernels import KernelUnavailable, load_cpu_kernels

    try:
        return load_cpu_kernels(required=options.cpu_kernels == "compiled", cache_dir=cache_dir)
    except KernelUnavailable as exc:
        raise ConfigError(
            f'[executor.torch] cpu_kernels = "compiled": {exc}; use "auto" or "torch"'
        ) from None
