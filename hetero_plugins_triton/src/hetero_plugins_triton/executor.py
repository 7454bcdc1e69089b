"""The Triton executor: core's model code on the Triton attention backend, run by core's ``ModelRunner``.

The factory settles where and how to run (GPU, or Triton's CPU interpreter when asked), checks the
kernels' capabilities against the model's config and the settings, and only then imports triton
and loads the weights. Pure decode steps replay CUDA graphs (core's ``DecodeGraphs``) unless
``cuda_graphs = false``; in interpreter mode the same padded static-input steps run eagerly.
"""

from __future__ import annotations

import torch

from hetero_core import ConfigError, PluginError
from hetero_core.executor import ExecutorContext
from hetero_core.logging import get_logger
from hetero_core.model.config import ModelConfig
from hetero_core.model.cpu.threads import intra_op_threads
from hetero_core.model.decode_graphs import build_decode_graphs
from hetero_core.model.loader import load_model
from hetero_core.model.runner import ModelRunner
from hetero_core.model.runner_executor import RunnerExecutor
from hetero_plugins_triton.capabilities import incompatibilities
from hetero_plugins_triton.options import TritonExecutorOptions
from hetero_plugins_triton.requirements import device_problem, interpreter_requested

log = get_logger("hetero.executor.triton")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TritonExecutor(RunnerExecutor):
    """A ``ModelRunner`` whose model attends with ``backend`` (``backend.TritonPagedAttention``)."""

    def __init__(
        self,
        ctx: ExecutorContext,
        backend,
        *,
        device: torch.device,
        dtype: str,
        num_threads: int | None = None,
        cuda_graphs: bool = False,
    ):
        if device.type == "cpu" or num_threads is not None:  # interpreter mode runs torch on the CPU
            torch.set_num_threads(intra_op_threads(num_threads))
        self.device, self.dtype = device, DTYPES[dtype]
        model = load_model(ctx.model_dir, backend=backend, device=device, dtype=self.dtype)
        self.runner = ModelRunner(
            model,
            num_blocks=ctx.num_blocks + cuda_graphs,  # + the graphs' scratch block
            block_size=ctx.block_size,
            dtype=self.dtype,
            device=device,
            num_swap_blocks=ctx.num_swap_blocks,
        )
        if cuda_graphs:
            self.graph_runner = build_decode_graphs(
                self.runner,
                scratch_block=ctx.num_blocks,
                max_num_seqs=ctx.max_num_seqs,
                max_model_len=ctx.max_model_len,
            )


def create_triton_executor(ctx: ExecutorContext) -> TritonExecutor:
    options = ctx.options if ctx.options is not None else TritonExecutorOptions()
    interpret = interpreter_requested(options.interpreter)
    device = _device(options, interpret)
    dtype = _dtype(options, interpret, device)
    if ctx.model_dir is None:
        raise ConfigError("the triton executor needs a model; set `model` to an HF directory or .gguf file")
    config = ModelConfig.from_dir(ctx.model_dir)
    reasons = incompatibilities(
        block_size=ctx.block_size,
        head_dim=config.head_dim,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        dtype=dtype,
        interpret=interpret,
        bf16_supported=interpret or torch.cuda.is_bf16_supported(),
    )
    if reasons:
        raise ConfigError(
            "executor 'triton' cannot run this model with these settings: " + "; ".join(reasons)
        )

    from hetero_plugins_triton.kernels.compile import import_triton

    import_triton(interpret)
    from hetero_plugins_triton.backend import KernelSettings, TritonPagedAttention

    num_sms = 1 if interpret else torch.cuda.get_device_properties(device).multi_processor_count
    backend = TritonPagedAttention(
        KernelSettings(
            interpret=interpret,
            num_sms=num_sms,
            num_splits=options.num_splits,
            decode_block_n=options.decode_block_n,
            prefill_block_m=options.prefill_block_m,
            prefill_block_n=options.prefill_block_n,
        )
    )
    log.info(
        "executor.triton.ready",
        device=str(device),
        dtype=dtype,
        interpreter=interpret,
        num_sms=num_sms,
        num_splits=options.num_splits or "auto",
    )
    return TritonExecutor(
        ctx,
        backend,
        device=device,
        dtype=dtype,
        num_threads=options.num_threads,
        cuda_graphs=options.cuda_graphs,
    )


def _device(options: TritonExecutorOptions, interpret: bool) -> torch.device:
    name = options.device or ("cpu" if interpret else "cuda")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"executor.triton.device: invalid device {name!r}; use e.g. 'cuda:0'") from exc
    if interpret:
        if device.type != "cpu":
            raise ConfigError(
                f"executor.triton.device is {name!r} but interpreter mode runs on the CPU; "
                "set device = 'cpu' or turn the interpreter off"
            )
        problem = device_problem(interpret)
        if problem:
            raise PluginError(f"executor 'triton' cannot run here: {problem}")
        return device
    if device.type != "cuda":
        raise ConfigError(
            f"executor.triton.device is {name!r}; the Triton kernels run on a CUDA device "
            "(or on the CPU with executor.triton.interpreter = true)"
        )
    problem = device_problem(interpret)
    if problem:
        raise PluginError(f"executor 'triton' cannot run here: {problem}")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(
            f"executor.triton.device is {name!r} but only {torch.cuda.device_count()} "
            "CUDA device(s) are visible"
        )
    return device


def _dtype(options: TritonExecutorOptions, interpret: bool, device: torch.device) -> str:
    if options.dtype != "auto":
        return options.dtype
    if interpret:
        return "float32"
    return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
