"""Core's two KV allocators pass the KV-allocator kit (with their own counts checked too: every block's
reference count equals its owners, no block is free twice, a table holds exactly the blocks it needs);
the kit catches broken allocators, naming the rule."""

import subprocess
import sys
from collections import Counter

import pytest

from hetero_core.engine.kv.kv_allocator import (
    NO_BLOCK_COPIES,
    BlockAllocatorError,
    KVAllocator,
    NoPrefixCache,
)
from hetero_core.kv import ContiguousBlockAllocator, PagedBlockAllocator
from hetero_core.testing import ContractFailure
from hetero_core.testing.kv_allocator_contract import ATTRIBUTES, MEMBERS, KVAllocatorContract
from hetero_core.testing.kv_allocator_world import World

RESERVED = 3  # blocks of a contiguous reservation in these tests


class CountingWorld(World):
    """The kit's world, plus what core's allocators promise about their internals."""

    def __init__(self, allocator, table_length):
        super().__init__(allocator)
        self.table_length = table_length  # num_computed -> the blocks a table holds

    def check_counts(self):
        super().check_counts()
        allocator = self.allocator
        owners = Counter(b for table in self.tables for b in table.blocks)
        for block in range(allocator.num_blocks):
            assert allocator.ref_count(block) == owners.get(block, 0), (
                f"block {block}: {owners.get(block, 0)} owners"
            )
        assert allocator.num_used_blocks == len(owners)
        free = list(allocator._free) + list(getattr(allocator, "_evictable", []))
        assert len(set(free)) == len(free) == allocator.num_free_blocks and not set(free) & set(owners)
        for table in self.tables:
            assert len(table.blocks) == self.table_length(allocator, table.num_computed), table


class TestPagedAllocator(KVAllocatorContract):
    def make_allocator(self, num_blocks, block_size):
        return PagedBlockAllocator(num_blocks, block_size)

    def world(self):
        return CountingWorld(
            self.make_allocator(self.num_blocks, self.block_size),
            lambda allocator, n: allocator.num_blocks_for(n),
        )


class TestContiguousAllocator(KVAllocatorContract):
    def make_allocator(self, num_blocks, block_size):
        return ContiguousBlockAllocator(num_blocks, block_size, max_model_len=RESERVED * block_size)

    def world(self):
        return CountingWorld(
            self.make_allocator(self.num_blocks, self.block_size),
            lambda allocator, n: max(RESERVED, allocator.num_blocks_for(n)),
        )


# -- the kit says what broke ----------------------------------------------------------------------
class LeakyAllocator(NoPrefixCache):
    """Forgets to return freed blocks to the pool."""

    def __init__(self, num_blocks, block_size):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_ids = list(range(num_blocks))
        self.owned = set()

    @property
    def num_free_blocks(self):
        return len(self.free_ids)

    def num_blocks_for(self, num_tokens):
        return -(-num_tokens // self.block_size)

    def allocate_slots(
        self, block_table, num_computed_tokens, num_new_tokens, computed=None, *, max_used_blocks=None
    ):
        needed = self.num_blocks_for(num_computed_tokens + num_new_tokens) - len(block_table)
        if needed > len(self.free_ids):
            return None
        for _ in range(max(0, needed)):
            block_table.append(self.free_ids.pop(0))
        self.owned.update(block_table)
        return NO_BLOCK_COPIES

    def free(self, block_table):
        if not self.owned.issuperset(block_table):
            raise BlockAllocatorError(f"double free of {block_table}")
        self.owned.difference_update(block_table)
        block_table.clear()  # the bug: the blocks never go back to free_ids


class SharingAllocator(LeakyAllocator):
    """Hands every table the same blocks."""

    def allocate_slots(
        self, block_table, num_computed_tokens, num_new_tokens, computed=None, *, max_used_blocks=None
    ):
        block_table[:] = list(range(self.num_blocks_for(num_computed_tokens + num_new_tokens)))
        return NO_BLOCK_COPIES


class Kit(KVAllocatorContract):
    __test__ = False

    def __init__(self, allocator_class):
        self.allocator_class = allocator_class

    def make_allocator(self, num_blocks, block_size):
        return self.allocator_class(num_blocks, block_size)


def test_a_leak_fails_naming_the_rule_and_the_counts():
    with pytest.raises(ContractFailure, match=r"^free returns every block: 0 of 12 free"):
        Kit(LeakyAllocator).test_allocate_slots_is_all_or_nothing()
    with pytest.raises(
        ContractFailure,
        match=r"^free blocks are the pool minus the held ones: "
        r"num_free_blocks=\d+, pool 12, \d+ held",
    ):
        Kit(LeakyAllocator).test_random_use_keeps_every_table_intact()


def test_a_block_given_to_two_writers_fails_naming_the_block():
    with pytest.raises(
        ContractFailure,
        match=r"^a block a table writes is held by no other table: "
        r"position 0 goes to block 0",
    ):
        Kit(SharingAllocator).test_allocate_slots_is_all_or_nothing()


class PagedWithoutCopies(PagedBlockAllocator):
    """Counts the copy but writes into the shared block."""

    def _copy_on_write(self, block_table, start, end):
        return ()


def test_a_missing_copy_on_write_fails_naming_the_rule():
    with pytest.raises(
        ContractFailure,
        match=r"^a block a table writes is held by no other table: "
        r"position 7 goes to block 1, which another table holds",
    ):
        Kit(PagedWithoutCopies).test_a_shared_block_is_copied_before_it_is_written()


def test_the_protocol_is_what_the_kit_and_the_plugin_checks_require():
    from hetero_core.plugin_system.checks import REQUIRED

    members = {name for name in vars(KVAllocator) if not name.startswith("_")} | set(
        KVAllocator.__annotations__
    )
    assert members == set(MEMBERS) | set(ATTRIBUTES)
    methods, attributes = REQUIRED["kv_allocator"]
    assert set(methods) == set(MEMBERS) and set(attributes) == set(ATTRIBUTES)


def test_without_hypothesis_the_kit_names_the_extra_to_install():
    code = (
        "import sys; sys.modules['hypothesis'] = None\n"
        "try:\n    import hetero_core.testing.kv_allocator_contract\n"
        "except ImportError as exc:\n    print(exc)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "pip install 'hetero-core[testing]'" in result.stdout, result.stderr
