"""PagedBlockAllocator: no leaks, no double frees, counts always match the owners' tables. (Random use:
the KV-allocator kit with the counts checked too, test_kv_allocator_contract.py.)"""

import pytest

from hetero_core.engine.kv.block_allocator import BlockAllocatorError, PagedBlockAllocator


def shared_pair(allocator, num_tokens):
    """Two tables sharing the same computed blocks (through the prefix cache)."""
    tokens = list(range(num_tokens))
    table: list[int] = []
    allocator.allocate_slots(table, 0, num_tokens)
    allocator.cache_blocks(table, num_tokens, lambda a, b: tokens[a:b])
    shared: list[int] = []
    allocator.allocate_slots(shared, num_tokens, 0, allocator.get_computed_blocks(tokens))
    return table, shared


def test_double_free_of_a_shared_block_only_fails_past_the_last_owner():
    allocator = PagedBlockAllocator(4, 16)
    table, shared = shared_pair(allocator, 32)
    assert shared == table and [allocator.ref_count(b) for b in table] == [2, 2]
    allocator.free(table)
    assert allocator.num_free_blocks == 2  # still owned by the other table
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


def test_a_table_grows_one_block_at_a_time_and_a_refusal_changes_nothing():
    allocator = PagedBlockAllocator(3, 4)
    table: list[int] = []
    assert allocator.allocate_slots(table, 0, 5).block_copies == () and table == [0, 1]
    assert allocator.allocate_slots(table, 5, 3) is not None and table == [0, 1]  # fits the second block
    assert allocator.allocate_slots(table, 8, 5) is None and table == [0, 1]  # two more: only one free
    assert allocator.num_free_blocks == 1
    assert allocator.allocate_slots(table, 8, 4) is not None and table == [0, 1, 2]
