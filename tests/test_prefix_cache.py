"""Prefix caching in the paged allocator: hash chain, reuse by reference count, LRU eviction,
copy-on-write, and a token comparison that makes a hash collision a miss."""

from collections import Counter

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hetero_core.engine import prefix_cache
from hetero_core.engine.block_allocator import BlockAllocatorError, PagedBlockAllocator

BS = 4


def computed(allocator, tokens):
    """A table holding ``tokens`` with every full block named in the cache, as after a prefill."""
    table = []
    hits = allocator.lookup_prefix(tokens)
    allocator.acquire_prefix(table, hits)
    allocator.grow(table, len(tokens))
    allocator.cache_full_blocks(table, len(tokens), lambda a, b: tokens[a:b])
    return table


def test_longest_cached_prefix_is_found_and_shared_by_reference_count():
    allocator = PagedBlockAllocator(16, BS)
    first = computed(allocator, list(range(10)))  # blocks [0-3] [4-7] full, [8, 9] partial
    hits = allocator.lookup_prefix(list(range(8)) + [99, 98, 97, 96])
    assert hits == first[:2]
    table = []
    allocator.acquire_prefix(table, hits)
    assert [allocator.ref_count(b) for b in table] == [2, 2]
    assert allocator.num_used_blocks == 3  # nothing new was allocated for the hit


def test_the_hash_chains_the_parent_so_equal_blocks_after_different_prefixes_do_not_match():
    allocator = PagedBlockAllocator(16, BS)
    computed(allocator, [1, 2, 3, 4, 5, 6, 7, 8])
    assert allocator.lookup_prefix([9, 9, 9, 9, 5, 6, 7, 8]) == []
    assert len(allocator.lookup_prefix([1, 2, 3, 4, 9, 9, 9, 9])) == 1


def test_partial_and_uncomputed_blocks_are_never_cached():
    allocator = PagedBlockAllocator(16, BS)
    tokens = list(range(12))
    table = []
    allocator.grow(table, 12)
    allocator.cache_full_blocks(table, 6, lambda a, b: tokens[a:b])  # only 6 tokens computed so far
    assert len(allocator.lookup_prefix(tokens)) == 1
    allocator.cache_full_blocks(table, 12, lambda a, b: tokens[a:b])
    assert len(allocator.lookup_prefix(tokens)) == 3


def test_freed_blocks_stay_cached_and_are_evicted_least_recently_used_first():
    allocator = PagedBlockAllocator(4, BS)
    a = computed(allocator, [1] * 8)  # two blocks
    b = computed(allocator, [2] * 8)  # two blocks: the pool is full
    allocator.free(a)
    allocator.free(b)
    assert allocator.num_free_blocks == 4 and allocator.num_cached_blocks == 4
    assert len(allocator.lookup_prefix([1] * 8)) == 2  # still reusable after its owner left
    table = []
    allocator.grow(table, 4)  # one block: evicts the least recently freed, the tail of chain a
    assert len(allocator.lookup_prefix([1] * 8)) == 1
    assert len(allocator.lookup_prefix([2] * 8)) == 2
    allocator.grow(table, 8)
    assert allocator.lookup_prefix([1] * 8) == []


def test_a_hit_revives_an_evictable_block_so_it_is_not_evicted_under_its_owner():
    allocator = PagedBlockAllocator(3, BS)
    allocator.free(computed(allocator, [7] * 8))
    table = []
    allocator.acquire_prefix(table, allocator.lookup_prefix([7] * 8))
    assert allocator.num_free_blocks == 1
    other = []
    allocator.grow(other, 4)
    with pytest.raises(BlockAllocatorError):
        allocator.grow(other, 8)
    assert len(allocator.lookup_prefix([7] * 8)) == 2


def test_num_blocks_to_acquire_counts_revived_cached_blocks():
    allocator = PagedBlockAllocator(8, BS)
    owner = computed(allocator, [3] * 8)
    hits = allocator.lookup_prefix([3] * 8)
    assert allocator.num_blocks_to_acquire(hits, 10) == 1  # hits in use: only the new third block
    allocator.free(owner)
    assert allocator.num_blocks_to_acquire(hits, 10) == 3  # hits are free blocks now: they count


def test_copy_on_write_gives_a_private_copy_of_a_shared_block_before_a_write():
    allocator = PagedBlockAllocator(8, BS)
    a = computed(allocator, [5] * 8)
    b = []
    allocator.acquire_prefix(b, allocator.lookup_prefix([5] * 8))
    assert allocator.num_shared_blocks(b, 7, 8) == 1
    pairs = allocator.copy_on_write(b, 7, 8)  # rewrite the last token of the second block
    assert pairs == [(a[1], b[1])] and b[1] != a[1] and b[0] == a[0]
    assert [allocator.ref_count(x) for x in (a[0], a[1], b[1])] == [2, 1, 1]
    assert allocator.copy_on_write(b, 7, 8) == []  # private now
    assert allocator.copy_on_write(a, 7, 8) == []  # a owns its block alone again


def test_a_hash_collision_is_a_miss_because_tokens_are_compared(monkeypatch):
    monkeypatch.setattr(prefix_cache, "block_hash", lambda parent, tokens: 42)
    allocator = PagedBlockAllocator(8, BS)
    computed(allocator, [1, 2, 3, 4])
    assert allocator.lookup_prefix([4, 3, 2, 1]) == []  # same hash, other tokens
    assert len(allocator.lookup_prefix([1, 2, 3, 4])) == 1
    computed(allocator, [4, 3, 2, 1])  # the colliding block is not cached over the first one
    assert len(allocator.lookup_prefix([1, 2, 3, 4])) == 1


class PrefixCacheMachine(RuleBasedStateMachine):
    """Random requests over a 3-token alphabet (so prefixes repeat): counts always match owners."""

    def __init__(self):
        super().__init__()
        self.allocator = PagedBlockAllocator(num_blocks=10, block_size=BS)
        self.owners: list[tuple[list[int], list[int]]] = []  # (table, tokens)

    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=20))
    def admit(self, tokens):
        hits = self.allocator.lookup_prefix(tokens)
        for i, block in enumerate(hits):  # a hit holds exactly the tokens it stands for
            assert self.allocator._index._tokens_of_block[block] == tuple(tokens[i * BS : (i + 1) * BS])
        if self.allocator.num_blocks_to_acquire(hits, len(tokens)) > self.allocator.num_free_blocks:
            return
        table = []
        self.allocator.acquire_prefix(table, hits)
        self.allocator.grow(table, len(tokens))
        self.allocator.cache_full_blocks(table, len(tokens), lambda a, b: tokens[a:b])
        self.owners.append((table, tokens))

    @precondition(lambda self: self.owners)
    @rule(data=st.data())
    def finish(self, data):
        table, _ = self.owners.pop(data.draw(st.integers(0, len(self.owners) - 1)))
        self.allocator.free(table)

    @invariant()
    def counts_match_owners(self):
        owners = Counter(b for table, _ in self.owners for b in table)
        allocator = self.allocator
        for block in range(allocator.num_blocks):
            assert allocator.ref_count(block) == owners.get(block, 0)
        assert allocator.num_used_blocks == len(owners)
        assert allocator.num_free_blocks + allocator.num_used_blocks == allocator.num_blocks
        free = list(allocator._free) + list(allocator._evictable)
        assert len(set(free)) == len(free) and not set(free) & set(owners)


TestPrefixCacheMachine = PrefixCacheMachine.TestCase
TestPrefixCacheMachine.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
