"""PagedBlockAllocator: a pool of fixed-size KV blocks with reference counts and a prefix cache.

The allocator owns the free lists and the counts; each ``Sequence`` owns its block table (a list of
block ids). A block is shared when its count is above one and returns to the free pool when its last
owner frees it. Freeing a block that is already free raises: a double free is a bug, never silently
absorbed. It implements ``KVAllocator`` (``engine/kv/kv_allocator.py``): the scheduler asks
``get_computed_blocks`` and an all-or-nothing ``allocate_slots``, and does no block arithmetic.

Prefix caching: once a full block's K/V are computed, ``cache_blocks`` names it in the
``PrefixCacheIndex`` by its chained hash; a new request then takes the longest cached prefix
(``get_computed_blocks``, then ``allocate_slots(..., computed)``) and computes only the rest. A cached
block whose last owner frees it stays cached, in LRU order, and is evicted only when the pool has no
plain free block left. Before a shared block is written, ``allocate_slots`` gives the writer a private
copy and returns the ``(source, destination)`` pair (the executor copies the data). The scheduler
decides whether to use the cache at all (setting ``enable_prefix_caching``).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable

from hetero_core.engine.kv.kv_allocator import (
    NO_BLOCK_COPIES,
    NO_COMPUTED_BLOCKS,
    BlockAllocatorError,
    ComputedBlocks,
    SlotAllocation,
)
from hetero_core.engine.kv.prefix_cache import PrefixCacheIndex

__all__ = ["BlockAllocatorError", "PagedBlockAllocator"]


class PagedBlockAllocator:
    has_prefix_cache = True
    has_copy_on_write = True

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))  # free, holding nothing reusable
        self._evictable: OrderedDict[int, None] = OrderedDict()  # free but cached, least recent first
        self._index = PrefixCacheIndex()

    # -- capacity ---------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks a request can get now (plain free + cached blocks nobody uses, evicted on demand)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks whose content a new request could reuse (in use or evictable)."""
        return len(self._index)

    def ref_count(self, block_id: int) -> int:
        """Owners of ``block_id`` (for tests and checks; the engine never asks)."""
        return self._ref_counts[block_id]

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    # -- the scheduler's questions ----------------------------------------------------------------
    def get_computed_blocks(self, token_ids: list[int]) -> ComputedBlocks:
        """Cached blocks holding the longest prefix of ``token_ids`` (full blocks only). Takes no
        reference: pass the result to ``allocate_slots``."""
        blocks: list[int] = []
        parent = None
        bs = self.block_size
        for start in range(0, len(token_ids) - bs + 1, bs):
            found = self._index.find(parent, tuple(token_ids[start : start + bs]))
            if found is None:
                break
            block, parent = found
            blocks.append(block)
        return ComputedBlocks(tuple(blocks), len(blocks) * bs) if blocks else NO_COMPUTED_BLOCKS

    def allocate_slots(
        self,
        block_table: list[int],
        num_computed_tokens: int,
        num_new_tokens: int,
        computed: ComputedBlocks | None = None,
        *,
        max_used_blocks: float | None = None,
    ) -> SlotAllocation | None:
        """Room for tokens ``[num_computed_tokens, num_computed_tokens + num_new_tokens)``, all or
        nothing: take ``computed`` (an empty table only), copy the shared blocks those tokens will
        write, append blocks. None, with nothing changed, if it does not fit."""
        if num_new_tokens == 1 and computed is None:  # a decode: its block is owned, or one new block
            index = num_computed_tokens // self.block_size
            if index < len(block_table):
                if self._ref_counts[block_table[index]] == 1:
                    return NO_BLOCK_COPIES
            elif (
                index == len(block_table)
                and self._free
                and (max_used_blocks is None or self.num_used_blocks + 1 <= max_used_blocks)
            ):
                block_table.append(self._take_block())
                return NO_BLOCK_COPIES
        hits = computed.block_ids if computed is not None else ()
        if hits and block_table:
            raise BlockAllocatorError("computed blocks can only start an empty block table")
        start, end = num_computed_tokens, num_computed_tokens + num_new_tokens
        needed = self._num_blocks_needed(block_table, hits, start, end)
        if needed > self.num_free_blocks:
            return None
        if max_used_blocks is not None and self.num_used_blocks + needed > max_used_blocks:
            return None
        for block_id in hits:
            if self._ref_counts[block_id] == 0:
                del self._evictable[block_id]
            self._ref_counts[block_id] += 1
            block_table.append(block_id)
        copies = self._copy_on_write(block_table, start, end) if needed else ()
        for _ in range(self.num_blocks_for(end) - len(block_table)):
            block_table.append(self._take_block())
        return SlotAllocation(copies) if copies else NO_BLOCK_COPIES

    def cache_blocks(
        self, block_table: list[int], num_computed_tokens: int, token_ids: Callable[[int, int], list[int]]
    ) -> None:
        """Name every full, computed block of ``block_table`` in the cache; ``token_ids(start, end)``
        gives the sequence's tokens. Cheap when nothing new is full (the usual decode step)."""
        bs = self.block_size
        num_full = min(num_computed_tokens // bs, len(block_table))
        first = num_full
        while first > 0 and self._index.hash_of(block_table[first - 1]) is None:
            first -= 1
        parent = self._index.hash_of(block_table[first - 1]) if first else None
        for i in range(first, num_full):
            parent = self._index.register(block_table[i], parent, tuple(token_ids(i * bs, (i + 1) * bs)))

    def free(self, block_table: list[int]) -> None:
        """Drop this owner's reference to every block, then empty ``block_table``.

        Blocks are released last to first, so the end of a cached chain is evicted before its start.
        """
        for block_id in block_table:
            self._check_owned(block_id)
        for block_id in reversed(block_table):
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] == 0:
                if self._index.is_cached(block_id):
                    self._evictable[block_id] = None
                else:
                    self._index.forget(block_id)
                    self._free.append(block_id)
        block_table.clear()

    # -- internals --------------------------------------------------------------------------------
    def _num_blocks_needed(self, block_table: list[int], hits: tuple[int, ...], start: int, end: int) -> int:
        """Free blocks consumed by taking ``hits`` (cached blocks nobody uses are free ones), copying
        the shared blocks that ``[start, end)`` writes and growing to ``end`` tokens."""
        refs = self._ref_counts
        table = hits or block_table
        needed = max(0, self.num_blocks_for(end) - len(table))
        if hits:
            needed += sum(1 for b in hits if refs[b] == 0)
        extra_ref = 1 if hits else 0  # the reference this table is about to take
        for i in range(start // self.block_size, min(len(table), self.num_blocks_for(end))):
            if refs[table[i]] + extra_ref > 1:
                needed += 1
        return needed

    def _copy_on_write(self, block_table: list[int], start: int, end: int) -> tuple[tuple[int, int], ...]:
        """Private copies of the shared blocks that positions ``[start, end)`` will write."""
        pairs = ()
        for i in range(start // self.block_size, min(len(block_table), self.num_blocks_for(end))):
            source = block_table[i]
            if self._ref_counts[source] > 1:
                destination = self._take_block()
                self._ref_counts[source] -= 1
                block_table[i] = destination
                pairs += ((source, destination),)
        return pairs

    def _take_block(self) -> int:
        if self._free:
            block_id = self._free.popleft()
        else:
            block_id, _ = self._evictable.popitem(last=False)  # least recently used cached block
            self._index.forget(block_id)
        self._ref_counts[block_id] = 1
        return block_id

    def _check_owned(self, block_id: int) -> None:
        if not 0 <= block_id < self.num_blocks:
            raise BlockAllocatorError(f"block {block_id} is outside the pool of {self.num_blocks}")
        if self._ref_counts[block_id] <= 0:
            raise BlockAllocatorError(f"block {block_id} is already free (double free)")
