"""The KV-allocator seam: what the scheduler and the engine call on a KV allocator, and nothing else.

The allocator owns the pool (free lists, reference counts, a prefix cache if it keeps one); each
sequence owns its block table, a list of block ids that the allocator fills and empties. The scheduler
asks whole questions, as vLLM's scheduler asks its ``KVCacheManager``:

- ``get_computed_blocks(token_ids)``: the cached blocks that hold the longest prefix of these tokens;
- ``allocate_slots(block_table, num_computed_tokens, num_new_tokens, computed)``: all or nothing,
  room for the new tokens (starting the table with ``computed``), or None when it does not fit;
- ``cache_blocks(...)``: name the table's full, computed blocks so later requests can reuse them;
- ``free(block_table)``: drop the table's references and empty it.

What an allocator can do it declares (``has_prefix_cache``, ``has_copy_on_write``); the scheduler
never probes for methods. The block counts, the copy-on-write and the memory headroom are the
allocator's arithmetic, never the scheduler's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "NO_BLOCK_COPIES",
    "NO_COMPUTED_BLOCKS",
    "BlockAllocatorError",
    "ComputedBlocks",
    "KVAllocator",
    "NoPrefixCache",
    "SlotAllocation",
]


class BlockAllocatorError(RuntimeError):
    """Internal invariant violated (a double free, a block outside the pool)."""


@dataclass(frozen=True)
class ComputedBlocks:
    """Cached blocks holding a prefix of a request's tokens (full blocks only), from
    ``get_computed_blocks``. Holds no reference: pass it to ``allocate_slots`` to take the blocks."""

    block_ids: tuple[int, ...]
    num_tokens: int  # tokens those blocks hold: len(block_ids) * block_size


@dataclass(frozen=True)
class SlotAllocation:
    """What ``allocate_slots`` did beyond filling the table: the ``(source, destination)`` block
    copies the executor must run before the step's batch (copy-on-write of shared blocks)."""

    block_copies: tuple[tuple[int, int], ...] = ()


NO_COMPUTED_BLOCKS = ComputedBlocks((), 0)
NO_BLOCK_COPIES = SlotAllocation()  # the usual answer: shared, so that a step allocates nothing for it


class KVAllocator(Protocol):
    """The minimum the engine calls on a KV allocator (``register_kv_allocators`` factories return one)."""

    num_blocks: int  # blocks in the pool; block ids are 0 .. num_blocks - 1
    block_size: int  # token slots per block
    has_prefix_cache: bool  # get_computed_blocks can return blocks; cache_blocks names them
    has_copy_on_write: bool  # allocate_slots copies a shared block before it is written

    @property
    def num_free_blocks(self) -> int:
        """Blocks a request can get now (cached blocks nobody uses count: they are evicted on demand)."""

    @property
    def num_cached_blocks(self) -> int:
        """Blocks whose content a new request could reuse (0 without a prefix cache)."""

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens."""

    def get_computed_blocks(self, token_ids: list[int]) -> ComputedBlocks:
        """The cached blocks holding the longest prefix of ``token_ids`` (``NO_COMPUTED_BLOCKS``
        without a prefix cache). Takes no reference."""

    def allocate_slots(
        self,
        block_table: list[int],
        num_computed_tokens: int,
        num_new_tokens: int,
        computed: ComputedBlocks | None = None,
        *,
        max_used_blocks: float | None = None,
    ) -> SlotAllocation | None:
        """Give ``block_table`` room for tokens ``[num_computed_tokens, num_computed_tokens +
        num_new_tokens)``, all or nothing. ``computed`` (only for an empty table) starts the table
        with those cached blocks. None, with nothing changed, when the free blocks do not suffice
        or when more than ``max_used_blocks`` would then be in use."""

    def cache_blocks(
        self, block_table: list[int], num_computed_tokens: int, token_ids: Callable[[int, int], list[int]]
    ) -> None:
        """Name the full blocks holding the first ``num_computed_tokens`` tokens in the prefix cache;
        ``token_ids(start, end)`` gives the sequence's tokens. Cheap when nothing new is full."""

    def free(self, block_table: list[int]) -> None:
        """Drop this table's reference to each of its blocks, then empty it. A block that is not
        held raises ``BlockAllocatorError`` (a double free is a bug, never absorbed)."""


class NoPrefixCache:
    """Mix into an allocator that keeps no prefix cache: the prefix-cache part of ``KVAllocator``."""

    has_prefix_cache = False
    has_copy_on_write = False
    num_cached_blocks = 0

    def get_computed_blocks(self, token_ids: list[int]) -> ComputedBlocks:
        return NO_COMPUTED_BLOCKS

    def cache_blocks(
        self, block_table: list[int], num_computed_tokens: int, token_ids: Callable[[int, int], list[int]]
    ) -> None:
        return None
