"""KVAllocatorContract: the tests every KV allocator passes, as a mixin an allocator's author subclasses.

    from hetero_core.testing.kv_allocator_contract import KVAllocatorContract

    class TestMyAllocator(KVAllocatorContract):
        def make_allocator(self, num_blocks, block_size):
            return MyAllocator(num_blocks, block_size)

Every test calls only what the engine calls (``hetero_core.kv.KVAllocator``) and plays the executor's
part: it writes each token's "K/V" (the token id) into the slot the table gives it and copies the
blocks that ``allocate_slots`` asks to copy. The rules (a broken one raises ``ContractFailure`` with the
rule and the offending values):

- a fresh pool is all free; ``num_blocks_for`` rounds up;
- ``allocate_slots`` fills the table with blocks of the pool, or returns None and changes nothing;
  it respects ``max_used_blocks``; a request that fits the whole pool fits an empty pool;
- a table's blocks never move, except a shared block replaced by its copy;
- a block a table writes is held by no other table (copy-on-write), so what a table computed stays
  in its blocks while it lives;
- free blocks are the pool minus the blocks that live tables hold; ``free`` empties the table; a
  double free or a block outside the pool raises ``BlockAllocatorError``;
- with a prefix cache: a lookup finds what was cached and every block it returns holds those tokens;
  without one: it finds nothing;
- random use (a hypothesis state machine: start, extend, cache, free) keeps all of the above.

Needs ``hypothesis`` (``pip install 'hetero-core[testing]'``); imports neither torch nor pytest.
"""

from __future__ import annotations

try:
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test
except ImportError as exc:  # an optional test dependency
    raise ImportError(
        "KVAllocatorContract generates random use with hypothesis, which is not installed: "
        "pip install 'hetero-core[testing]'"
    ) from exc

from hetero_core.engine.kv.kv_allocator import BlockAllocatorError
from hetero_core.testing.kv_allocator_world import AllocatorMachine, Table, World, expect

__all__ = ["KVAllocatorContract"]
MEMBERS = ("num_blocks_for", "get_computed_blocks", "allocate_slots", "cache_blocks", "free")
ATTRIBUTES = (
    "num_blocks",
    "block_size",
    "has_prefix_cache",
    "has_copy_on_write",
    "num_free_blocks",
    "num_cached_blocks",
)


class KVAllocatorContract:
    """Mix into a test class and define ``make_allocator(num_blocks, block_size)`` (a fresh allocator)."""

    num_blocks: int = 12
    block_size: int = 4
    machine_settings = settings(max_examples=100, stateful_step_count=40, deadline=None, database=None)

    def make_allocator(self, num_blocks: int, block_size: int):
        raise NotImplementedError(
            "subclass KVAllocatorContract and implement make_allocator(num_blocks, block_size)"
        )

    def world(self) -> World:
        return World(self.make_allocator(self.num_blocks, self.block_size))

    # -- the contract -----------------------------------------------------------------------------
    def test_it_has_what_the_engine_calls(self):
        allocator = self.make_allocator(self.num_blocks, self.block_size)
        missing = [m for m in MEMBERS if not callable(getattr(allocator, m, None))]
        missing += [a for a in ATTRIBUTES if not hasattr(allocator, a)]
        expect(
            not missing,
            "it implements hetero_core.kv.KVAllocator",
            f"{type(allocator).__name__} lacks {missing}",
        )
        flags = (allocator.has_prefix_cache, allocator.has_copy_on_write)
        expect(
            all(isinstance(f, bool) for f in flags),
            "capabilities are declared as bools",
            f"has_prefix_cache={flags[0]!r}, has_copy_on_write={flags[1]!r}",
        )

    def test_a_fresh_pool_is_all_free(self):
        allocator = self.make_allocator(self.num_blocks, self.block_size)
        sizes = (allocator.num_blocks, allocator.block_size, allocator.num_free_blocks)
        expect(
            sizes == (self.num_blocks, self.block_size, self.num_blocks),
            "a fresh pool is all free",
            f"(num_blocks, block_size, num_free_blocks) = {sizes} for a pool of "
            f"{self.num_blocks} x {self.block_size}",
        )

    def test_num_blocks_for_rounds_up(self):
        allocator, bs = self.make_allocator(self.num_blocks, self.block_size), self.block_size
        for n in (1, bs - 1, bs, bs + 1, 2 * bs, 5 * bs + 1):
            expect(
                allocator.num_blocks_for(n) == -(-n // bs),
                "num_blocks_for rounds up",
                f"num_blocks_for({n}) = {allocator.num_blocks_for(n)} with blocks of {bs}",
            )

    def test_a_request_that_fits_the_pool_fits_an_empty_pool(self):
        world = self.world()
        table = Table(tokens=list(range(self.num_blocks * self.block_size)))
        world.tables.append(table)
        expect(
            world.allocate(table, len(table.tokens)),
            "a request that fits the pool fits an empty pool",
            f"allocate_slots for {len(table.tokens)} tokens returned None on an empty pool",
        )
        world.check_counts()

    def test_allocate_slots_is_all_or_nothing(self):
        world, bs = self.world(), self.block_size
        while True:  # fill the pool with one-block requests
            table = Table(tokens=[7] * bs)
            world.tables.append(table)
            if not world.allocate(table, bs):
                world.tables.remove(table)
                break
        world.check_counts()
        last = world.tables[-1]
        last.tokens += [8] * (bs * self.num_blocks)
        expect(
            not world.allocate(last, len(last.tokens) - last.num_computed),
            "allocate_slots is all or nothing",
            "a full pool gave room for more than it has",
        )
        for table in list(world.tables):
            world.free(table)
        expect(
            world.allocator.num_free_blocks == self.num_blocks,
            "free returns every block",
            f"{world.allocator.num_free_blocks} of {self.num_blocks} free after freeing every table",
        )

    def test_max_used_blocks_is_respected(self):
        world, bs = self.world(), self.block_size
        first, second = Table(tokens=[5] * bs), Table(tokens=[6] * (2 * bs))
        world.tables += [first, second]
        expect(
            world.allocate(first, bs), "a request that fits the pool fits an empty pool", "one block refused"
        )
        used = self.num_blocks - world.allocator.num_free_blocks
        expect(
            not world.allocate(second, 2 * bs, max_used_blocks=used + 0.5),
            "allocate_slots respects max_used_blocks",
            f"two more blocks given with {used} in use and max_used_blocks={used + 0.5}",
        )
        expect(
            world.allocate(second, 2 * bs, max_used_blocks=float(self.num_blocks)),
            "allocate_slots respects max_used_blocks",
            f"refused with max_used_blocks={float(self.num_blocks)}, the pool",
        )

    def test_a_block_outside_the_pool_and_a_double_free_raise(self):
        allocator = self.make_allocator(self.num_blocks, self.block_size)
        for table, what in (([self.num_blocks + 3], "a block outside the pool"), ([0], "a double free")):
            try:
                allocator.free(table)
            except BlockAllocatorError:
                continue
            expect(False, f"{what} raises BlockAllocatorError", f"free({table}) raised nothing")

    def test_computed_blocks_hold_the_tokens_of_the_prefix(self):
        world, bs = self.world(), self.block_size
        owner = Table(tokens=list(range(3 * bs + 1)))
        world.tables.append(owner)
        world.allocate(owner, len(owner.tokens))
        world.allocator.cache_blocks(owner.blocks, owner.num_computed, owner.token_ids)
        computed = world.lookup(owner.tokens[: 3 * bs] + [99])
        if world.allocator.has_prefix_cache:
            expect(
                list(computed.block_ids) == owner.blocks[:3],
                "a lookup finds what was cached",
                f"cached {owner.blocks[:3]}, found {list(computed.block_ids)}",
            )
        expect(
            not world.lookup([99] + owner.tokens).block_ids,
            "a lookup finds only the same prefix",
            "a prompt starting with another token found computed blocks",
        )

    def test_a_shared_block_is_copied_before_it_is_written(self):
        world, bs = self.world(), self.block_size
        owner = Table(tokens=[4] * (2 * bs))
        world.tables.append(owner)
        world.allocate(owner, 2 * bs)
        world.allocator.cache_blocks(owner.blocks, owner.num_computed, owner.token_ids)
        reader = Table(tokens=list(owner.tokens))
        computed = world.lookup(reader.tokens)
        if not (world.allocator.has_prefix_cache and world.allocator.has_copy_on_write):
            return
        expect(computed.num_tokens == 2 * bs, "a lookup finds what was cached", f"found {computed}")
        reader.num_computed = 2 * bs - 1  # the last token is recomputed, inside the shared last block
        world.tables.append(reader)
        expect(
            world.allocate(reader, 1, computed),
            "a request that fits the pool fits it",  # and checks the copy
            f"no room for one token with {world.allocator.num_free_blocks} blocks free",
        )
        world.check_tables_intact()
        world.check_counts()

    def test_random_use_keeps_every_table_intact(self):
        contract = self

        class Machine(AllocatorMachine):
            def make_world(self):
                return contract.world()

        run_state_machine_as_test(Machine, settings=self.machine_settings)
