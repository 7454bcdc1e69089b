"""The cuda executor: core's Llama-family model code on flash-attn's paged kernels, with decode
steps replayed from CUDA graphs.

Start-up, in order: the kernels (flash-attn 2.x, else flash-attn-4) have their capabilities checked
against the settings (block size, dtype, device and its compute capability, head size) before any
weight is read; the model loads on the device; the KV pool
is sized (``max_num_blocks``, or a GPU memory share after a profiling forward) with one extra
scratch block for padded graph rows, held by core's ``ModelRunner``; decode graphs are captured
(core's ``DecodeGraphs``). Per step, a pure decode that fits a captured size replays a graph;
anything else (prefills, mixed steps, ``cuda_graphs = false``) runs eagerly through the runner.
Either way the step's inputs reach the GPU in one copy from pinned memory and nothing waits for the
GPU. Logits come back as fp32 rows, on the device, for the sampled sequences.
"""

from __future__ import annotations

import torch

from hetero_core import ConfigError, ModelLoadError, PluginError
from hetero_core.executor import ExecutorContext
from hetero_core.logging import get_logger
from hetero_core.model.config import ModelConfig
from hetero_core.model.decode_graphs import DecodeGraphs, default_batch_sizes
from hetero_core.model.loader import load_model
from hetero_core.model.runner import ModelRunner
from hetero_core.model.runner_executor import RunnerExecutor
from hetero_plugins_cuda.attention import FlashAttnBackend
from hetero_plugins_cuda.kernels import FlashAttnKernels
from hetero_plugins_cuda.kv_sizing import blocks_for_memory_share, bytes_per_block
from hetero_plugins_cuda.loader import load_flash_attn
from hetero_plugins_cuda.options import CudaExecutorOptions
from hetero_plugins_cuda.preflight import missing_requirements

__all__ = ["CudaExecutor", "create_cuda_executor", "missing_requirements"]

log = get_logger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CudaExecutor(RunnerExecutor):
    """``kernels``: flash-attn's (default) or another provider with the same API (a test double)."""

    def __init__(
        self,
        ctx: ExecutorContext,
        options: CudaExecutorOptions | None = None,
        kernels: FlashAttnKernels | None = None,
    ):
        options = options or (ctx.options if ctx.options is not None else CudaExecutorOptions())
        if ctx.model_dir is None:
            raise ModelLoadError(
                "the cuda executor needs a model; set `model` to an HF directory or .gguf file"
            )
        self.kernels = kernels if kernels is not None else load_flash_attn()
        self.device = _device(options.device)
        self.dtype = DTYPES[options.dtype]
        self.block_size = ctx.block_size
        self.max_model_len = ctx.max_model_len
        self.max_num_seqs = ctx.max_num_seqs
        self.max_num_batched_tokens = ctx.max_num_batched_tokens
        self.max_blocks_per_seq = -(-ctx.max_model_len // ctx.block_size)
        config = ModelConfig.from_dir(ctx.model_dir)
        capability = torch.cuda.get_device_capability(self.device) if self.device.type == "cuda" else None
        problems = self.kernels.problems(
            block_size=ctx.block_size,
            dtype=self.dtype,
            device=self.device,
            head_dim=config.head_dim,
            capability=capability,
        )
        problems += _option_problems(options, ctx)
        if problems:
            raise ConfigError("executor 'cuda' cannot run these settings: " + "; ".join(problems))
        fast = self.kernels.fast_block_size
        if fast is not None and ctx.block_size != fast and config.head_dim <= 128:
            log.info(
                "flash_attn.block_size_hint",
                kernels=self.kernels.name,
                block_size=ctx.block_size,
                fast_block_size=fast,
                hint=f"block_size = {fast} loads KV pages by TMA (faster)",
            )

        self.backend = FlashAttnBackend(self.kernels)
        self.model = load_model(ctx.model_dir, backend=self.backend, device=self.device, dtype=self.dtype)
        if options.gpu_memory_utilization is not None:
            self.num_kv_blocks = blocks_for_memory_share(
                self, options.gpu_memory_utilization, ctx.num_blocks, graphs=options.cuda_graphs
            )
        else:
            self.num_kv_blocks = ctx.num_blocks
        self._check_kv_memory(self.num_kv_blocks + 1)
        self.runner = ModelRunner(
            self.model,
            num_blocks=self.num_kv_blocks + 1,  # + the scratch block
            block_size=self.block_size,
            dtype=self.dtype,
            device=self.device,
        )
        self.graph_runner = None
        if options.cuda_graphs and getattr(self.model, "captures_in_cuda_graphs", True):  # not a MoE model
            sizes = options.cuda_graph_batch_sizes or default_batch_sizes(ctx.max_num_seqs)
            self.graph_runner = DecodeGraphs(
                self.model, self.kv_caches, batch_sizes=sizes, max_blocks_per_seq=self.max_blocks_per_seq,
                scratch_block=self.num_kv_blocks, block_size=self.block_size, device=self.device,
            )  # fmt: skip
            with torch.inference_mode():
                self.graph_runner.capture()
        # No block copies or swap: the prefix cache keeps a fully cached prompt's last token uncached and
        # swap preemption falls back to recompute (engine/kv/block_transfer.py). The pool is the one
        # sized here.
        self.capabilities = self.runner_capabilities(
            num_kv_blocks=self.num_kv_blocks, block_copy=False, block_swap=False
        )
        log.info(
            "executor.ready",
            executor="cuda",
            kernels=self.kernels.name,
            device=str(self.device),
            dtype=options.dtype,
            num_kv_blocks=self.num_kv_blocks,
            cuda_graphs=options.cuda_graphs,
        )

    def shutdown(self) -> None:
        self.graph_runner = None
        self.model = None  # before the runner empties CUDA's cache, so the weights are freed with it
        self.runner.shutdown()

    def _check_kv_memory(self, num_blocks: int) -> None:
        """Refuse a pool that does not fit in the device's free memory, before allocating it."""
        if self.device.type != "cuda":
            return
        needed = num_blocks * bytes_per_block(self.model.config, self.block_size, self.dtype)
        free, _ = torch.cuda.mem_get_info(self.device)
        if needed > free:
            raise ConfigError(
                f"max_num_blocks = {num_blocks - 1} needs {needed / 2**30:.2f} GiB of KV cache but "
                f"{free / 2**30:.2f} GiB are free on {self.device}; lower max_num_blocks or set "
                "executor.cuda.gpu_memory_utilization (e.g. 0.9) to size the pool from memory"
            )


def _option_problems(options: CudaExecutorOptions, ctx: ExecutorContext) -> list[str]:
    problems = []
    sizes = options.cuda_graph_batch_sizes or []
    too_big = [s for s in sizes if s > ctx.max_num_seqs]
    if too_big:
        problems.append(
            f"executor.cuda.cuda_graph_batch_sizes {too_big} exceed max_batch_size {ctx.max_num_seqs} "
            "(a step never has more sequences); drop them or raise max_batch_size"
        )
    if sizes and not options.cuda_graphs:
        problems.append(
            "executor.cuda.cuda_graph_batch_sizes is set but cuda_graphs is false; drop one of them"
        )
    if options.gpu_memory_utilization is not None and not options.device.startswith("cuda"):
        problems.append(
            f"executor.cuda.gpu_memory_utilization needs a CUDA device (device is {options.device!r}); "
            "unset it to use max_num_blocks"
        )
    return problems


def _device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(
            f"executor.cuda.device: invalid device {name!r}; use e.g. 'cuda' or 'cuda:1'"
        ) from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"executor.cuda.device is {name!r} but this torch build sees no CUDA device")
    return device


def create_cuda_executor(ctx: ExecutorContext) -> CudaExecutor:
    reasons = missing_requirements()
    if reasons:
        raise PluginError("executor 'cuda' cannot run here: " + "; ".join(reasons))
    return CudaExecutor(ctx)
