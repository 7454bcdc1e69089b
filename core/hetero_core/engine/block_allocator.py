"""PagedBlockAllocator: a pool of fixed-size KV blocks with reference counts and a prefix cache.

The allocator owns the free lists and the counts; each ``Sequence`` owns its block table (a list of
block ids). A block is shared when its count is above one and returns to the free pool when its last
owner frees it. Freeing a block that is already free raises: a double free is a bug, never silently
absorbed.

Prefix caching: once a full block's K/V are computed, ``cache_full_blocks`` names it in the
``PrefixCacheIndex`` by its chained hash; a new request then takes the longest cached prefix
(``lookup_prefix`` + ``acquire_prefix``) and computes only the rest. A cached block whose last owner
frees it stays cached, in LRU order, and is evicted only when the pool has no plain free block left.
Before a shared block is written it is copied (``copy_on_write``; the executor copies the data).
The scheduler decides whether to use the cache at all (setting ``enable_prefix_caching``).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable

from hetero_core.engine.prefix_cache import PrefixCacheIndex


class BlockAllocatorError(RuntimeError):
    """Internal invariant violated (double free, out of blocks without a check)."""


class PagedBlockAllocator:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))  # free, holding nothing reusable
        self._evictable: OrderedDict[int, None] = OrderedDict()  # free but cached, least recent first
        self._index = PrefixCacheIndex()
        self.num_queried_tokens = 0  # prefix-cache lookups, in tokens
        self.num_hit_tokens = 0  # of which served from the cache

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
        return self._ref_counts[block_id]

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, block_table: list[int], num_tokens: int) -> int:
        """Extra blocks ``block_table`` needs so that it holds ``num_tokens`` tokens."""
        return max(0, self.num_blocks_for(num_tokens) - len(block_table))

    def can_grow(self, block_table: list[int], num_tokens: int) -> bool:
        return self.num_new_blocks(block_table, num_tokens) <= self.num_free_blocks

    def grow(self, block_table: list[int], num_tokens: int) -> None:
        """Append blocks to ``block_table`` until it holds ``num_tokens`` tokens."""
        needed = self.num_new_blocks(block_table, num_tokens)
        if needed > self.num_free_blocks:
            raise BlockAllocatorError(f"need {needed} blocks, {self.num_free_blocks} free")
        for _ in range(needed):
            block_table.append(self._take_block())

    def fork(self, block_table: list[int]) -> list[int]:
        """Share every block of ``block_table`` with a new owner; return the new table."""
        for block_id in block_table:
            self._check_owned(block_id)
            self._ref_counts[block_id] += 1
        return list(block_table)

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

    # -- copy-on-write ----------------------------------------------------------------------------
    def num_shared_blocks(self, block_table: list[int], start: int, end: int) -> int:
        """Blocks of ``block_table`` holding positions ``[start, end)`` that other owners share."""
        last = min(len(block_table), self.num_blocks_for(end))
        return sum(1 for i in range(start // self.block_size, last) if self._ref_counts[block_table[i]] > 1)

    def copy_on_write(self, block_table: list[int], start: int, end: int) -> list[tuple[int, int]]:
        """Give ``block_table`` private copies of the shared blocks that positions ``[start, end)``
        will write; return the ``(source, destination)`` pairs the executor must copy first."""
        pairs = []
        last = min(len(block_table), self.num_blocks_for(end))
        for i in range(start // self.block_size, last):
            source = block_table[i]
            if self._ref_counts[source] > 1:
                if not self.num_free_blocks:
                    raise BlockAllocatorError("copy-on-write: no free block (check num_shared_blocks first)")
                destination = self._take_block()
                self._ref_counts[source] -= 1
                block_table[i] = destination
                pairs.append((source, destination))
        return pairs

    # -- prefix cache -----------------------------------------------------------------------------
    def lookup_prefix(self, token_ids: list[int]) -> list[int]:
        """Cached blocks holding the longest prefix of ``token_ids`` (full blocks only). Takes no
        reference: pass the result to ``acquire_prefix``."""
        blocks: list[int] = []
        parent = None
        bs = self.block_size
        for start in range(0, len(token_ids) - bs + 1, bs):
            found = self._index.find(parent, tuple(token_ids[start : start + bs]))
            if found is None:
                break
            block, parent = found
            blocks.append(block)
        return blocks

    def num_blocks_to_acquire(self, hit_blocks: list[int], num_tokens: int) -> int:
        """Free blocks consumed by taking ``hit_blocks`` and growing to ``num_tokens`` tokens."""
        revived = sum(1 for b in hit_blocks if self._ref_counts[b] == 0)
        return max(0, self.num_blocks_for(num_tokens) - len(hit_blocks)) + revived

    def acquire_prefix(self, block_table: list[int], hit_blocks: list[int]) -> None:
        """Start the empty ``block_table`` with the cached ``hit_blocks`` (one reference each)."""
        if block_table:
            raise BlockAllocatorError("acquire_prefix needs an empty block table")
        for block_id in hit_blocks:
            if self._ref_counts[block_id] == 0:
                del self._evictable[block_id]
            self._ref_counts[block_id] += 1
            block_table.append(block_id)

    def record_lookup(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        self.num_queried_tokens += num_queried_tokens
        self.num_hit_tokens += num_hit_tokens

    def cache_full_blocks(self, block_table: list[int], num_computed_tokens: int,
                          token_ids: Callable[[int, int], list[int]]) -> None:
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

    # -- internals --------------------------------------------------------------------------------
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
