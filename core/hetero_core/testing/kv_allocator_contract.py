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

from collections import Counter
from dataclasses import dataclass, field

try:
    from hypothesis import settings, strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test
except ImportError as exc:  # an optional test dependency
    raise ImportError(
        "KVAllocatorContract generates random use with hypothesis, which is not installed: "
        "pip install 'hetero-core[testing]'"
    ) from exc

from hetero_core.engine.kv_allocator import BlockAllocatorError, ComputedBlocks
from hetero_core.testing.contract_failure import ContractFailure

__all__ = ["KVAllocatorContract"]
DOCUMENTS = ([1] * 40, [1] * 8 + [2] * 32, [3, 4, 5, 6] * 10)  # recurring prefixes for the prefix cache
MEMBERS = ("num_blocks_for", "get_computed_blocks", "allocate_slots", "cache_blocks", "free")
ATTRIBUTES = ("num_blocks", "block_size", "has_prefix_cache", "has_copy_on_write", "num_free_blocks",
              "num_cached_blocks")


def expect(ok: bool, rule: str, detail: str) -> None:
    """Fail with the rule and what broke it."""
    if not ok:
        raise ContractFailure(rule, detail)


@dataclass
class Table:
    """A sequence as the kit plays it: its block table, its tokens, how many are computed."""

    blocks: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    num_computed: int = 0

    def token_ids(self, start: int, end: int) -> list[int]:
        return self.tokens[start:end]


class World:
    """One allocator, the kit's tables and the "K/V" each block holds (token ids by slot)."""

    def __init__(self, allocator) -> None:
        self.allocator = allocator
        self.bs = allocator.block_size
        self.tables: list[Table] = []
        self.slots: dict[tuple[int, int], int] = {}  # (block, offset) -> token id written there

    def lookup(self, tokens: list[int]) -> ComputedBlocks:
        """The computed blocks for ``tokens``, checked: they hold those tokens and take nothing."""
        allocator, bs = self.allocator, self.bs
        num_free = allocator.num_free_blocks
        computed = allocator.get_computed_blocks(tokens)
        blocks = list(computed.block_ids)
        expect(allocator.num_free_blocks == num_free, "get_computed_blocks takes no block",
               f"num_free_blocks went from {num_free} to {allocator.num_free_blocks}")
        expect(computed.num_tokens == len(blocks) * bs <= len(tokens), "computed blocks are full blocks of the prefix",
               f"{len(blocks)} blocks of {bs} for num_tokens={computed.num_tokens} of {len(tokens)} tokens")
        expect(allocator.has_prefix_cache or not blocks, "without a prefix cache nothing is computed",
               f"get_computed_blocks returned {blocks}")
        for i, block in enumerate(blocks):
            held = [self.slots.get((block, j)) for j in range(bs)]
            expect(held == tokens[i * bs : (i + 1) * bs], "a computed block holds those tokens",
                   f"block {block} (position {i}) holds {held}, the prefix has {tokens[i * bs:(i + 1) * bs]}")
        return computed

    def allocate(self, table: Table, num_new: int, computed: ComputedBlocks | None = None,
                 max_used_blocks: float | None = None) -> bool:
        """``allocate_slots`` for the table's next ``num_new`` tokens, checked, then "computed"."""
        allocator, bs = self.allocator, self.bs
        before, num_free = list(table.blocks), allocator.num_free_blocks
        start, end = table.num_computed, table.num_computed + num_new
        slots = allocator.allocate_slots(table.blocks, start, num_new, computed, max_used_blocks=max_used_blocks)
        if slots is None:
            expect(table.blocks == before and allocator.num_free_blocks == num_free, "allocate_slots is all or nothing",
                   f"it returned None but the table went from {before} to {table.blocks} and num_free_blocks "
                   f"from {num_free} to {allocator.num_free_blocks}")
            return False
        self._check_filled(table, before, computed, slots.block_copies, end)
        if max_used_blocks is not None:
            used = allocator.num_blocks - allocator.num_free_blocks
            expect(used <= max_used_blocks, "allocate_slots respects max_used_blocks",
                   f"{used} blocks in use after it, max_used_blocks={max_used_blocks}")
        for source, destination in slots.block_copies:  # the executor copies before the batch runs
            for j in range(bs):
                if (source, j) in self.slots:
                    self.slots[destination, j] = self.slots[source, j]
        others = Counter(b for other in self.tables if other is not table for b in other.blocks)
        for position in range(start, end):
            block = table.blocks[position // bs]
            expect(not others[block], "a block a table writes is held by no other table",
                   f"position {position} goes to block {block}, which another table holds (no copy-on-write)")
            self.slots[block, position % bs] = table.tokens[position]
        table.num_computed = end
        return True

    def _check_filled(self, table: Table, before: list[int], computed, copies, end: int) -> None:
        allocator, blocks = self.allocator, table.blocks
        expect(len(blocks) >= allocator.num_blocks_for(end), "allocate_slots fills the table",
               f"{len(blocks)} blocks hold {end} tokens of {self.bs} per block")
        expect(all(0 <= b < allocator.num_blocks for b in blocks), "blocks are in the pool",
               f"table {blocks}, pool of {allocator.num_blocks}")
        expect(len(set(blocks)) == len(blocks), "a table holds a block once", f"table {blocks}")
        kept = before or list(computed.block_ids if computed is not None else ())
        replaced = dict(copies)
        for i, block in enumerate(kept):
            expect(blocks[i] == block or replaced.get(block) == blocks[i], "a table's blocks never move",
                   f"index {i} held {block}, now {blocks[i]}; block copies {list(copies)}")

    def check_counts(self) -> None:
        allocator = self.allocator
        held = {b for table in self.tables for b in table.blocks}
        expect(allocator.num_free_blocks == allocator.num_blocks - len(held),
               "free blocks are the pool minus the held ones",
               f"num_free_blocks={allocator.num_free_blocks}, pool {allocator.num_blocks}, {len(held)} held")

    def check_tables_intact(self) -> None:
        for table in self.tables:
            for position in range(table.num_computed):
                block = table.blocks[position // self.bs]
                held = self.slots.get((block, position % self.bs))
                expect(held == table.tokens[position], "what a table computed stays in its blocks",
                       f"position {position} (block {block}) holds {held}, was {table.tokens[position]}")

    def free(self, table: Table) -> None:
        stale = list(table.blocks)
        self.tables.remove(table)
        self.allocator.free(table.blocks)
        expect(table.blocks == [], "free empties the table", f"after free the table is {table.blocks}")
        if stale and not {b for other in self.tables for b in other.blocks} & set(stale):
            try:
                self.allocator.free(list(stale))
            except BlockAllocatorError:
                return
            expect(False, "a double free raises BlockAllocatorError", f"freeing {stale} again raised nothing")


class KVAllocatorContract:
    """Mix into a test class and define ``make_allocator(num_blocks, block_size)`` (a fresh allocator)."""

    num_blocks: int = 12
    block_size: int = 4
    machine_settings = settings(max_examples=100, stateful_step_count=40, deadline=None, database=None)

    def make_allocator(self, num_blocks: int, block_size: int):
        raise NotImplementedError("subclass KVAllocatorContract and implement make_allocator(num_blocks, block_size)")

    def world(self) -> World:
        return World(self.make_allocator(self.num_blocks, self.block_size))

    # -- the contract -----------------------------------------------------------------------------
    def test_it_has_what_the_engine_calls(self):
        allocator = self.make_allocator(self.num_blocks, self.block_size)
        missing = [m for m in MEMBERS if not callable(getattr(allocator, m, None))]
        missing += [a for a in ATTRIBUTES if not hasattr(allocator, a)]
        expect(not missing, "it implements hetero_core.kv.KVAllocator", f"{type(allocator).__name__} lacks {missing}")
        flags = (allocator.has_prefix_cache, allocator.has_copy_on_write)
        expect(all(isinstance(f, bool) for f in flags), "capabilities are declared as bools",
               f"has_prefix_cache={flags[0]!r}, has_copy_on_write={flags[1]!r}")

    def test_a_fresh_pool_is_all_free(self):
        allocator = self.make_allocator(self.num_blocks, self.block_size)
        sizes = (allocator.num_blocks, allocator.block_size, allocator.num_free_blocks)
        expect(sizes == (self.num_blocks, self.block_size, self.num_blocks), "a fresh pool is all free",
               f"(num_blocks, block_size, num_free_blocks) = {sizes} for a pool of {self.num_blocks} x {self.block_size}")

    def test_num_blocks_for_rounds_up(self):
        allocator, bs = self.make_allocator(self.num_blocks, self.block_size), self.block_size
        for n in (1, bs - 1, bs, bs + 1, 2 * bs, 5 * bs + 1):
            expect(allocator.num_blocks_for(n) == -(-n // bs), "num_blocks_for rounds up",
                   f"num_blocks_for({n}) = {allocator.num_blocks_for(n)} with blocks of {bs}")

    def test_a_request_that_fits_the_pool_fits_an_empty_pool(self):
        world = self.world()
        table = Table(tokens=list(range(self.num_blocks * self.block_size)))
        world.tables.append(table)
        expect(world.allocate(table, len(table.tokens)), "a request that fits the pool fits an empty pool",
               f"allocate_slots for {len(table.tokens)} tokens returned None on an empty pool")
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
        expect(not world.allocate(last, len(last.tokens) - last.num_computed), "allocate_slots is all or nothing",
               "a full pool gave room for more than it has")
        for table in list(world.tables):
            world.free(table)
        expect(world.allocator.num_free_blocks == self.num_blocks, "free returns every block",
               f"{world.allocator.num_free_blocks} of {self.num_blocks} free after freeing every table")

    def test_max_used_blocks_is_respected(self):
        world, bs = self.world(), self.block_size
        first, second = Table(tokens=[5] * bs), Table(tokens=[6] * (2 * bs))
        world.tables += [first, second]
        expect(world.allocate(first, bs), "a request that fits the pool fits an empty pool", "one block refused")
        used = self.num_blocks - world.allocator.num_free_blocks
        expect(not world.allocate(second, 2 * bs, max_used_blocks=used + 0.5), "allocate_slots respects max_used_blocks",
               f"two more blocks given with {used} in use and max_used_blocks={used + 0.5}")
        expect(world.allocate(second, 2 * bs, max_used_blocks=float(self.num_blocks)),
               "allocate_slots respects max_used_blocks", f"refused with max_used_blocks={float(self.num_blocks)}, the pool")

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
            expect(list(computed.block_ids) == owner.blocks[:3], "a lookup finds what was cached",
                   f"cached {owner.blocks[:3]}, found {list(computed.block_ids)}")
        expect(not world.lookup([99] + owner.tokens).block_ids, "a lookup finds only the same prefix",
               "a prompt starting with another token found computed blocks")

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
        expect(world.allocate(reader, 1, computed), "a request that fits the pool fits it",  # and checks the copy
               f"no room for one token with {world.allocator.num_free_blocks} blocks free")
        world.check_tables_intact()
        world.check_counts()

    def test_random_use_keeps_every_table_intact(self):
        contract = self

        class Machine(AllocatorMachine):
            def make_world(self):
                return contract.world()

        run_state_machine_as_test(Machine, settings=self.machine_settings)


class AllocatorMachine(RuleBasedStateMachine):
    """Random start / extend / cache / free, checked after every rule."""

    def __init__(self) -> None:
        super().__init__()
        self.world = self.make_world()

    def make_world(self) -> World:
        raise NotImplementedError

    @rule(document=st.sampled_from(DOCUMENTS), length=st.sampled_from([4, 8]) | st.integers(1, 30), data=st.data(),
          max_used=st.sampled_from([None, None, 6.0, 9.5]))
    def start(self, document, length, data, max_used):
        world, allocator = self.world, self.world.allocator
        table = Table(tokens=document[:length])
        computed = None
        if allocator.has_prefix_cache:  # as the scheduler asks: the last token is recomputed unless it can copy
            limit = length if allocator.has_copy_on_write else length - 1
            computed = world.lookup(table.tokens[:limit])
            table.num_computed = min(computed.num_tokens, length - 1)
        num_new = data.draw(st.integers(1, length - table.num_computed))
        world.tables.append(table)
        if not world.allocate(table, num_new, computed, max_used):
            world.tables.remove(table)

    @precondition(lambda self: self.world.tables)
    @rule(data=st.data(), extra=st.lists(st.integers(0, 6), max_size=9))
    def extend(self, data, extra):
        table = data.draw(st.sampled_from(self.world.tables))
        table.tokens += extra
        if table.num_computed < len(table.tokens):
            self.world.allocate(table, data.draw(st.integers(1, len(table.tokens) - table.num_computed)))

    @precondition(lambda self: self.world.tables)
    @rule(data=st.data())
    def cache(self, data):
        table = data.draw(st.sampled_from(self.world.tables))
        self.world.allocator.cache_blocks(table.blocks, table.num_computed, table.token_ids)

    @precondition(lambda self: self.world.tables)
    @rule(data=st.data())
    def free(self, data):
        self.world.free(data.draw(st.sampled_from(self.world.tables)))

    @invariant()
    def counts_and_contents_hold(self):
        self.world.check_counts()
        self.world.check_tables_intact()
