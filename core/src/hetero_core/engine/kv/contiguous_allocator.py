"""ContiguousBlockAllocator: the static scheme, one ``max_model_len`` reservation per request.

On a request's first allocation it takes ``ceil(max_model_len / block_size)`` blocks at once (one run
of consecutive block ids when the pool has one, else the lowest free ids), whatever the request's
length, as engines did before paging. The reservation then holds the whole request: it never grows
and never preempts. The slots it holds beyond the request's tokens are the waste that paging removes
(``bench/kv_allocators.py`` measures it); in exchange, fewer requests fit in the same pool.

It keeps no prefix cache (``NoPrefixCache``: it declares none, so the scheduler sees no cached prefix)
and so never shares a block. A table that needs more than its reservation (only when
``max_model_len`` here is set below the engine's) grows block by block, continuing its run when the
next id is free.
"""

from __future__ import annotations

from hetero_core.engine.kv.kv_allocator import (
    NO_BLOCK_COPIES,
    BlockAllocatorError,
    ComputedBlocks,
    NoPrefixCache,
    SlotAllocation,
)
from hetero_core.errors import ConfigError

__all__ = ["ContiguousBlockAllocator"]


class ContiguousBlockAllocator(NoPrefixCache):
    def __init__(self, num_blocks: int, block_size: int, max_model_len: int) -> None:
        if num_blocks < 1 or block_size < 1 or max_model_len < 1:
            raise ValueError("num_blocks, block_size and max_model_len must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.num_reserved_blocks = -(-max_model_len // block_size)  # per request
        if self.num_reserved_blocks > num_blocks:
            raise ConfigError(
                f"kv_allocator 'contiguous' reserves max_model_len ({max_model_len}) tokens per request, "
                f"{self.num_reserved_blocks} blocks of {block_size}, but the pool has {num_blocks} blocks; "
                f"raise max_num_blocks to {self.num_reserved_blocks} or more, lower max_model_len, "
                'or use kv_allocator = "paged"'
            )
        self._ref_counts = [0] * num_blocks
        self._free: set[int] = set(range(num_blocks))

    # -- capacity ---------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def ref_count(self, block_id: int) -> int:
        """Owners of ``block_id``: 0 or 1 (for tests and checks; the engine never asks)."""
        return self._ref_counts[block_id]

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens (the reservation aside)."""
        return -(-num_tokens // self.block_size)

    # -- the scheduler's questions ----------------------------------------------------------------
    def allocate_slots(
        self,
        block_table: list[int],
        num_computed_tokens: int,
        num_new_tokens: int,
        computed: ComputedBlocks | None = None,
        *,
        max_used_blocks: float | None = None,
    ) -> SlotAllocation | None:
        """Reserve (empty table) or extend ``block_table`` so that it holds ``num_computed_tokens +
        num_new_tokens`` tokens, all or nothing; None, with nothing changed, if it does not fit."""
        if computed is not None and computed.block_ids:
            raise BlockAllocatorError(
                "kv_allocator 'contiguous' keeps no prefix cache: it takes no computed blocks"
            )
        needed = self._num_new_blocks(block_table, num_computed_tokens + num_new_tokens)
        if needed > self.num_free_blocks:
            return None
        if max_used_blocks is not None and self.num_used_blocks + needed > max_used_blocks:
            return None
        if not needed:
            return NO_BLOCK_COPIES
        if block_table:  # past the reservation: one block at a time, continuing the run if possible
            new = []
            for _ in range(needed):
                new.append(self._take_next((new or block_table)[-1] + 1))
        else:
            new = self._take_run(needed)
        for block_id in new:
            self._ref_counts[block_id] = 1
        block_table.extend(new)
        return NO_BLOCK_COPIES

    def free(self, block_table: list[int]) -> None:
        """Drop this owner's reference to every block, then empty ``block_table``."""
        for block_id in block_table:
            self._check_owned(block_id)
        for block_id in block_table:
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] == 0:
                self._free.add(block_id)
        block_table.clear()

    # -- internals --------------------------------------------------------------------------------
    def _num_new_blocks(self, block_table: list[int], num_tokens: int) -> int:
        """Extra blocks ``block_table`` needs to hold ``num_tokens`` tokens: the whole reservation
        when the table is empty."""
        needed = self.num_blocks_for(num_tokens)
        if not block_table and num_tokens > 0:
            needed = max(needed, self.num_reserved_blocks)
        return max(0, needed - len(block_table))

    def _take_run(self, count: int) -> list[int]:
        """The first run of ``count`` consecutive free ids, else the ``count`` lowest free ids."""
        free = sorted(self._free)
        start = 0
        for i in range(1, len(free) + 1):
            if i - start == count:
                run = free[start:i]
                break
            if i < len(free) and free[i] != free[i - 1] + 1:
                start = i
        else:
            run = free[:count]
        self._free.difference_update(run)
        return run

    def _take_next(self, preferred: int) -> int:
        """``preferred`` if free (keeps a table's run going), else the lowest free id."""
        block_id = preferred if preferred in self._free else min(self._free)
        self._free.remove(block_id)
        return block_id

    def _check_owned(self, block_id: int) -> None:
        if not 0 <= block_id < self.num_blocks:
            raise BlockAllocatorError(f"block {block_id} is outside the pool of {self.num_blocks}")
        if self._ref_counts[block_id] <= 0:
            raise BlockAllocatorError(f"block {block_id} is already free (double free)")
