"""The torch executor's memory on the CPU: which dtypes the model fits in (``dtype = "auto"`` skips the
others) and how many KV blocks its pool gets when ``max_num_blocks`` is not given.

Both come from what this process may take, read once at the executor's start before any weight is
loaded (``model/cpu/memory_budget.py``), and the weights' bytes from the checkpoint's headers
(``model/cpu/weight_size.py``); the pool's rules are ``model/cpu/kv_cache_size.py``'s.
"""

from __future__ import annotations

import torch

from hetero_core.logging import get_logger
from hetero_core.model.cpu.kv_cache_size import KVPoolSize, kv_pool_size
from hetero_core.model.cpu.memory_budget import format_bytes, memory_budget
from hetero_core.model.cpu.memory_fit import MemoryFit
from hetero_core.model.cpu.probe_model import read_config
from hetero_core.model.cpu.weight_size import checkpoint_tensors
from hetero_core.model.source import resolve_model_source
from hetero_core.plugin_system.architectures import kv_bytes_per_token
from hetero_core.plugin_system.installed import architecture_of

log = get_logger("hetero.executor")


def memory_fit(ctx, options, kernels) -> MemoryFit:
    """The model's fit in this process's memory, for the dtypes the executor may run it in."""
    source = resolve_model_source(ctx.model_dir)
    config = read_config(source)
    per_token = kv_bytes_per_token(architecture_of(config).kv_layout(config), 4)
    block_codes = kernels is not None and kernels.block_codes and options.prepack_weights
    return MemoryFit(checkpoint_tensors(source), memory_budget(), per_token, ctx.max_model_len, block_codes)


def kv_pool(ctx, fit: MemoryFit, dtype: torch.dtype) -> KVPoolSize | None:
    """The pool's size from memory; None where ``max_num_blocks`` is given (or there are no settings:
    the executor's own tests), the pool then being ``ctx.num_blocks`` exactly."""
    settings = ctx.settings
    if settings is None or settings.max_num_blocks_given:
        return None
    name = str(dtype).removeprefix("torch.")
    element = torch.empty((), dtype=dtype).element_size()
    size = kv_pool_size(
        bytes_per_block=fit.kv_bytes_per_token * element // 4 * ctx.block_size,
        block_size=ctx.block_size,
        max_num_seqs=settings.max_num_seqs,
        max_model_len=ctx.max_model_len,
        budget=fit.budget,
        weight_bytes=fit.weight_bytes(name, codes=True) + fit.working_set_bytes(name, codes=True),
        kv_cache_memory=settings.kv_cache_memory,
    )
    log.info(
        "kv_cache.sized",
        num_blocks=size.num_blocks,
        size=format_bytes(size.num_blocks * fit.kv_bytes_per_token * element // 4 * ctx.block_size),
        reason=size.reason,
    )
    return size
