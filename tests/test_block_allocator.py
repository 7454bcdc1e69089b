"""PagedBlockAllocator: no leaks, no double frees, counts always match the owners' tables."""

from collections import Counter

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hetero_core.engine.block_allocator import BlockAllocatorError, PagedBlockAllocator


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.allocator = PagedBlockAllocator(num_blocks=12, block_size=4)
        self.tables: list[list[int]] = []
        self.num_tokens: list[int] = []

    @rule(num_tokens=st.integers(1, 30))
    def allocate(self, num_tokens):
        table: list[int] = []
        if self.allocator.can_grow(table, num_tokens):
            self.allocator.grow(table, num_tokens)
            assert len(table) == -(-num_tokens // 4)
            self.tables.append(table)
            self.num_tokens.append(num_tokens)
        else:
            with pytest.raises(BlockAllocatorError):
                self.allocator.grow(table, num_tokens)
            assert table == []

    @precondition(lambda self: self.tables)
    @rule(data=st.data(), extra=st.integers(1, 9))
    def append(self, data, extra):
        i = data.draw(st.integers(0, len(self.tables) - 1))
        target = self.num_tokens[i] + extra
        before = list(self.tables[i])
        if self.allocator.can_grow(self.tables[i], target):
            self.allocator.grow(self.tables[i], target)
            self.num_tokens[i] = target
            assert self.tables[i][: len(before)] == before  # existing blocks never move
        else:
            with pytest.raises(BlockAllocatorError):
                self.allocator.grow(self.tables[i], target)
            assert self.tables[i] == before

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def fork(self, data):
        i = data.draw(st.integers(0, len(self.tables) - 1))
        self.tables.append(self.allocator.fork(self.tables[i]))
        self.num_tokens.append(self.num_tokens[i])

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def free(self, data):
        i = data.draw(st.integers(0, len(self.tables) - 1))
        table = self.tables.pop(i)
        self.num_tokens.pop(i)
        stale = list(table)
        self.allocator.free(table)
        assert table == []
        if stale and all(self.allocator.ref_count(b) == 0 for b in stale):
            with pytest.raises(BlockAllocatorError, match="double free"):
                self.allocator.free(list(stale))

    @invariant()
    def counts_match_owners(self):
        owners = Counter(b for table in self.tables for b in table)
        for block in range(self.allocator.num_blocks):
            assert self.allocator.ref_count(block) == owners.get(block, 0)
        assert self.allocator.num_free_blocks == self.allocator.num_blocks - len(owners)
        assert len(set(self.allocator._free)) == self.allocator.num_free_blocks  # no block twice


TestAllocator = AllocatorMachine.TestCase
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
