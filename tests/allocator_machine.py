"""Test helper: a hypothesis state machine for KV block allocators.

Random allocate / grow / fork / free on a 12-block pool of 4-token blocks; after every step each
block's reference count equals its owners, free + used blocks are the pool, and a stale table's double
free is refused. Subclasses choose the allocator and how many blocks a new table takes.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hetero_core.engine.block_allocator import BlockAllocatorError

BLOCK_SIZE = 4


class AllocatorMachine(RuleBasedStateMachine):
    def make_allocator(self):
        raise NotImplementedError

    def blocks_for_new_table(self, num_tokens: int) -> int:
        """Blocks a fresh table holds after growing to ``num_tokens`` tokens."""
        return -(-num_tokens // BLOCK_SIZE)

    def __init__(self):
        super().__init__()
        self.allocator = self.make_allocator()
        self.tables: list[list[int]] = []
        self.num_tokens: list[int] = []

    @rule(num_tokens=st.integers(1, 30))
    def allocate(self, num_tokens):
        table: list[int] = []
        if self.allocator.can_grow(table, num_tokens):
            self.allocator.grow(table, num_tokens)
            assert len(table) == self.blocks_for_new_table(num_tokens)
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
            assert len(self.tables[i]) == max(len(before), -(-target // BLOCK_SIZE))
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
        assert self.allocator.num_free_blocks + self.allocator.num_used_blocks == self.allocator.num_blocks
