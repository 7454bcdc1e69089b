"""PagedBlockAllocator: a pool of fixed-size KV blocks with reference counts.

The allocator owns the free list and the counts; each ``Sequence`` owns its block table (a list of
block ids). A block is shared when its count is above one (prefix caching and forks build on this)
and returns to the free list when its last owner frees it. Freeing a block that is already free
raises: a double free is a bug, never silently absorbed.
"""

from __future__ import annotations

from collections import deque


class BlockAllocatorError(RuntimeError):
    """Internal invariant violated (double free, out of blocks without a check)."""


class PagedBlockAllocator:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, block_table: list[int], num_tokens: int) -> int:
        """Extra blocks ``block_table`` needs so that it holds ``num_tokens`` tokens."""
        return max(0, self.num_blocks_for(num_tokens) - len(block_table))

    def can_grow(self, block_table: list[int], num_tokens: int) -> bool:
        return self.num_new_blocks(block_table, num_tokens) <= len(self._free)

    def grow(self, block_table: list[int], num_tokens: int) -> None:
        """Append blocks to ``block_table`` until it holds ``num_tokens`` tokens."""
        needed = self.num_new_blocks(block_table, num_tokens)
        if needed > len(self._free):
            raise BlockAllocatorError(f"need {needed} blocks, {len(self._free)} free")
        for _ in range(needed):
            block_id = self._free.popleft()
            self._ref_counts[block_id] = 1
            block_table.append(block_id)

    def fork(self, block_table: list[int]) -> list[int]:
        """Share every block of ``block_table`` with a new owner; return the new table."""
        for block_id in block_table:
            self._check_owned(block_id)
            self._ref_counts[block_id] += 1
        return list(block_table)

    def free(self, block_table: list[int]) -> None:
        """Drop this owner's reference to every block, then empty ``block_table``."""
        for block_id in block_table:
            self._check_owned(block_id)
        for block_id in reversed(block_table):
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] == 0:
                self._free.append(block_id)
        block_table.clear()

    def _check_owned(self, block_id: int) -> None:
        if not 0 <= block_id < self.num_blocks:
            raise BlockAllocatorError(f"block {block_id} is outside the pool of {self.num_blocks}")
        if self._ref_counts[block_id] <= 0:
            raise BlockAllocatorError(f"block {block_id} is already free (double free)")
