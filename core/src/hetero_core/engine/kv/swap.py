"""SwapSpace: the ids of the CPU blocks that hold swapped-out sequences' K/V.

Core only keeps the free list; the executor holds the data (``swap_out(pairs)`` copies device blocks
to CPU blocks, ``swap_in(pairs)`` copies them back). Its size is the ``num_swap_blocks`` setting.
"""

from __future__ import annotations

from collections import deque

from hetero_core.engine.kv.kv_allocator import BlockAllocatorError


class SwapSpace:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        if num_blocks > len(self._free):
            raise BlockAllocatorError(f"swap space: need {num_blocks} blocks, {len(self._free)} free")
        return [self._free.popleft() for _ in range(num_blocks)]

    def free(self, blocks: list[int]) -> None:
        if len(set(blocks)) != len(blocks) or set(blocks) & set(self._free):
            raise BlockAllocatorError(f"swap space: double free of {sorted(blocks)}")
        self._free.extend(blocks)
        blocks.clear()
