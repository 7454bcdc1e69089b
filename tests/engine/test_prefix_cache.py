"""Prefix caching in the paged allocator: hash chain, reuse by reference count, LRU eviction,
copy-on-write, and a token comparison that makes a hash collision a miss. (Random use, with the
counts checked against the owners after every step: the KV-allocator kit, test_kv_allocator_contract.py.)"""

from hetero_core.engine.kv import prefix_cache
from hetero_core.engine.kv.block_allocator import PagedBlockAllocator

BS = 4


def computed(allocator, tokens):
    """A table holding ``tokens`` with every full block named in the cache, as after a prefill."""
    table = []
    hits = allocator.get_computed_blocks(tokens)
    assert allocator.allocate_slots(table, hits.num_tokens, len(tokens) - hits.num_tokens, hits) is not None
    allocator.cache_blocks(table, len(tokens), lambda a, b: tokens[a:b])
    return table


def lookup(allocator, tokens) -> list[int]:
    return list(allocator.get_computed_blocks(tokens).block_ids)


def test_longest_cached_prefix_is_found_and_shared_by_reference_count():
    allocator = PagedBlockAllocator(16, BS)
    first = computed(allocator, list(range(10)))  # blocks [0-3] [4-7] full, [8, 9] partial
    hits = allocator.get_computed_blocks(list(range(8)) + [99, 98, 97, 96])
    assert list(hits.block_ids) == first[:2] and hits.num_tokens == 8
    table = []
    allocator.allocate_slots(table, 8, 0, hits)
    assert table == first[:2] and [allocator.ref_count(b) for b in table] == [2, 2]
    assert allocator.num_used_blocks == 3  # nothing new was allocated for the hit


def test_the_hash_chains_the_parent_so_equal_blocks_after_different_prefixes_do_not_match():
    allocator = PagedBlockAllocator(16, BS)
    computed(allocator, [1, 2, 3, 4, 5, 6, 7, 8])
    assert lookup(allocator, [9, 9, 9, 9, 5, 6, 7, 8]) == []
    assert len(lookup(allocator, [1, 2, 3, 4, 9, 9, 9, 9])) == 1


def test_partial_and_uncomputed_blocks_are_never_cached():
    allocator = PagedBlockAllocator(16, BS)
    tokens = list(range(12))
    table = []
    allocator.allocate_slots(table, 0, 12)
    allocator.cache_blocks(table, 6, lambda a, b: tokens[a:b])  # only 6 tokens computed so far
    assert len(lookup(allocator, tokens)) == 1
    allocator.cache_blocks(table, 12, lambda a, b: tokens[a:b])
    assert len(lookup(allocator, tokens)) == 3


def test_freed_blocks_stay_cached_and_are_evicted_least_recently_used_first():
    allocator = PagedBlockAllocator(4, BS)
    a = computed(allocator, [1] * 8)  # two blocks
    b = computed(allocator, [2] * 8)  # two blocks: the pool is full
    allocator.free(a)
    allocator.free(b)
    assert allocator.num_free_blocks == 4 and allocator.num_cached_blocks == 4
    assert len(lookup(allocator, [1] * 8)) == 2  # still reusable after its owner left
    table = []
    allocator.allocate_slots(table, 0, 4)  # one block: evicts the least recently freed, the tail of chain a
    assert len(lookup(allocator, [1] * 8)) == 1
    assert len(lookup(allocator, [2] * 8)) == 2
    allocator.allocate_slots(table, 4, 4)
    assert lookup(allocator, [1] * 8) == []


def test_a_hit_revives_an_evictable_block_so_it_is_not_evicted_under_its_owner():
    allocator = PagedBlockAllocator(3, BS)
    allocator.free(computed(allocator, [7] * 8))
    table = []
    allocator.allocate_slots(table, 8, 0, allocator.get_computed_blocks([7] * 8))
    assert allocator.num_free_blocks == 1
    other = []
    allocator.allocate_slots(other, 0, 4)
    assert allocator.allocate_slots(other, 4, 4) is None and len(other) == 1  # all or nothing
    assert len(lookup(allocator, [7] * 8)) == 2


def test_a_hit_costs_the_new_blocks_and_the_revived_cached_ones():
    allocator = PagedBlockAllocator(8, BS)
    owner = computed(allocator, [3] * 8)  # 2 blocks in use
    hits = allocator.get_computed_blocks([3] * 8)
    table = []  # hits in use: only the new third block counts
    assert allocator.allocate_slots(table, 8, 2, hits, max_used_blocks=2.5) is None and table == []
    assert allocator.allocate_slots(table, 8, 2, hits, max_used_blocks=3) is not None
    allocator.free(table)
    allocator.free(owner)
    assert allocator.num_used_blocks == 0  # both cached blocks are free (evictable) now: they count
    assert allocator.allocate_slots(table, 8, 2, hits, max_used_blocks=2) is None and table == []
    assert allocator.allocate_slots(table, 8, 2, hits, max_used_blocks=3) is not None


def test_copy_on_write_gives_a_private_copy_of_a_shared_block_before_a_write():
    allocator = PagedBlockAllocator(8, BS)
    a = computed(allocator, [5] * 8)
    b = []
    hits = allocator.get_computed_blocks([5] * 8)
    # rewriting the last token of the second block needs one block for the copy
    assert allocator.allocate_slots(b, 7, 1, hits, max_used_blocks=2) is None and b == []
    slots = allocator.allocate_slots(b, 7, 1, hits, max_used_blocks=3)
    assert slots.block_copies == ((a[1], b[1]),) and b[1] != a[1] and b[0] == a[0]
    assert [allocator.ref_count(x) for x in (a[0], a[1], b[1])] == [2, 1, 1]
    assert allocator.allocate_slots(b, 7, 1).block_copies == ()  # private now
    assert allocator.allocate_slots(a, 7, 1).block_copies == ()  # a owns its block alone again


def test_a_hash_collision_is_a_miss_because_tokens_are_compared(monkeypatch):
    monkeypatch.setattr(prefix_cache, "block_hash", lambda parent, tokens: 42)
    allocator = PagedBlockAllocator(8, BS)
    computed(allocator, [1, 2, 3, 4])
    assert lookup(allocator, [4, 3, 2, 1]) == []  # same hash, other tokens
    assert len(lookup(allocator, [1, 2, 3, 4])) == 1
    computed(allocator, [4, 3, 2, 1])  # the colliding block is not cached over the first one
    assert len(lookup(allocator, [1, 2, 3, 4])) == 1
