"""PagedBlockAllocator: no leaks, no double frees, counts always match the owners' tables."""

import pytest
from hypothesis import settings
from hypothesis.stateful import invariant

from allocator_machine import BLOCK_SIZE, AllocatorMachine
from hetero_core.engine.block_allocator import BlockAllocatorError, PagedBlockAllocator


class PagedAllocatorMachine(AllocatorMachine):
    def make_allocator(self):
        return PagedBlockAllocator(num_blocks=12, block_size=BLOCK_SIZE)

    @invariant()
    def no_block_listed_free_twice(self):
        assert len(set(self.allocator._free)) == self.allocator.num_free_blocks


TestAllocator = PagedAllocatorMachine.TestCase
TestAllocator.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_double_free_of_a_shared_block_only_fails_past_the_last_owner():
    allocator = PagedBlockAllocator(4, 16)
    table: list[int] = []
    allocator.grow(table, 20)
    shared = allocator.fork(table)
    allocator.free(table)
    assert allocator.num_free_blocks == 2  # still owned by the fork
    stale = list(shared)
    allocator.free(shared)
    assert allocator.num_free_blocks == 4
    with pytest.raises(BlockAllocatorError, match="double free"):
        allocator.free(stale)


def test_block_outside_the_pool_is_rejected():
    allocator = PagedBlockAllocator(2, 16)
    with pytest.raises(BlockAllocatorError, match="outside the pool"):
        allocator.free([5])


def test_blocks_needed_rounds_up():
    allocator = PagedBlockAllocator(8, 16)
    assert [allocator.num_blocks_for(n) for n in (1, 16, 17, 32, 33)] == [1, 1, 2, 2, 3]
