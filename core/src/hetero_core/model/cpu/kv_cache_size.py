"""How many KV blocks the CPU executor's pool gets when ``max_num_blocks`` is not given.

``kv_cache_memory`` set (bytes or a size, "4GiB"; vLLM's CPU backend reads ``VLLM_CPU_KVCACHE_SPACE``
in GiB, its engines take ``--kv-cache-memory-bytes``): as many blocks as that holds, refused when
more than the memory the weights leave. Unset: ``KV_MEMORY_FRACTION`` of the memory the weights and
their working set leave (``memory_budget``, ``memory_fit``), at most what ``max_num_seqs`` sequences
of ``max_model_len`` tokens can use, and at most ``KV_MEMORY_CAP`` (4 GiB). A pool of untouched blocks
costs nothing (``zeroed_memory``), but the allocator cycles through every block before it reuses one,
so a long-running server's pool becomes resident: the fraction leaves the rest to the page cache and
other processes, and the cap keeps a small model on a large machine from growing to half of it (4 GiB
holds 91,000 tokens of SmolLM2-135M in fp32, 32,000 of a Llama-3.1-8B in bf16). Memory that
cannot be read (not Linux): ``DEFAULT_NUM_BLOCKS``, the pool every start had before.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetero_core.errors import ConfigError
from hetero_core.model.cpu.memory_budget import MemoryBudget, format_bytes

KV_MEMORY_FRACTION = 0.5
KV_MEMORY_CAP = 4 << 30  # bytes: the most a pool sized from memory takes (kv_cache_memory sets more)
DEFAULT_NUM_BLOCKS = 1024  # the max_num_blocks default


@dataclass(frozen=True)
class KVPoolSize:
    num_blocks: int
    reason: str  # one line for the log: where the number comes from


def kv_pool_size(
    *,
    bytes_per_block: int,
    block_size: int,
    max_num_seqs: int,
    max_model_len: int,
    budget: MemoryBudget | None,
    weight_bytes: int,
    kv_cache_memory: int | None = None,
) -> KVPoolSize:
    """The pool for ``bytes_per_block``-byte blocks; ``weight_bytes``: the weights and their working set
    (``MemoryFit.needed_bytes`` less its KV share), taken from ``budget`` first."""
    left = None if budget is None else budget.available_bytes - weight_bytes
    where = "" if budget is None else f" ({format_bytes(left)} left after the weights of {budget.describe()})"
    if kv_cache_memory is not None:
        if left is not None and kv_cache_memory > left:
            raise ConfigError(
                f"kv_cache_memory = {format_bytes(kv_cache_memory)} does not fit{where}; lower it, "
                "or set max_num_blocks"
            )
        blocks = kv_cache_memory // bytes_per_block
        if blocks < 1:
            raise ConfigError(
                f"kv_cache_memory = {kv_cache_memory} bytes holds no KV block ({bytes_per_block} bytes "
                f"each: {block_size} tokens); raise it"
            )
        return KVPoolSize(blocks, f"kv_cache_memory = {format_bytes(kv_cache_memory)}")
    usable = max_num_seqs * -(-max_model_len // block_size)  # every admitted sequence at its longest
    if left is None:
        blocks = min(DEFAULT_NUM_BLOCKS, usable)
        return KVPoolSize(blocks, "the memory available is unknown: the default pool")
    share = int(KV_MEMORY_FRACTION * max(left, 0))
    fits = min(share, KV_MEMORY_CAP) // bytes_per_block
    if fits < 1:
        raise ConfigError(
            f"no memory is left for the KV cache{where}; free memory, use a smaller dtype or "
            "--quantization int8, or set max_num_blocks or kv_cache_memory"
        )
    if fits >= usable:
        return KVPoolSize(usable, f"what max_num_seqs x max_model_len can use{where}")
    if share > KV_MEMORY_CAP:
        return KVPoolSize(fits, f"the {format_bytes(KV_MEMORY_CAP)} cap of a pool sized from memory{where}")
    return KVPoolSize(fits, f"{KV_MEMORY_FRACTION:.0%} of the memory{where}")
