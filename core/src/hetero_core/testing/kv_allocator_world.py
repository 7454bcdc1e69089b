"""The world the KV-allocator kit plays in: tables as the engine keeps them, the "K/V" each block holds
(token ids by slot, written as an executor would), and the checks every kit test runs (``World``);
random use as a hypothesis state machine (``AllocatorMachine``). See ``kv_allocator_contract``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hetero_core.engine.kv.kv_allocator import BlockAllocatorError, ComputedBlocks
from hetero_core.testing.contract_failure import ContractFailure

__all__ = ["DOCUMENTS", "AllocatorMachine", "Table", "World", "expect"]
DOCUMENTS = ([1] * 40, [1] * 8 + [2] * 32, [3, 4, 5, 6] * 10)  # recurring prefixes for the prefix cache


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
        expect(
            allocator.num_free_blocks == num_free,
            "get_computed_blocks takes no block",
            f"num_free_blocks went from {num_free} to {allocator.num_free_blocks}",
        )
        expect(
            computed.num_tokens == len(blocks) * bs <= len(tokens),
            "computed blocks are full blocks of the prefix",
            f"{len(blocks)} blocks of {bs} for num_tokens={computed.num_tokens} of {len(tokens)} tokens",
        )
        expect(
            allocator.has_prefix_cache or not blocks,
            "without a prefix cache nothing is computed",
            f"get_computed_blocks returned {blocks}",
        )
        for i, block in enumerate(blocks):
            held = [self.slots.get((block, j)) for j in range(bs)]
            expect(
                held == tokens[i * bs : (i + 1) * bs],
                "a computed block holds those tokens",
                f"block {block} (position {i}) holds {held}, the prefix has {tokens[i * bs : (i + 1) * bs]}",
            )
        return computed

    def allocate(
        self,
        table: Table,
        num_new: int,
        computed: ComputedBlocks | None = None,
        max_used_blocks: float | None = None,
    ) -> bool:
        """``allocate_slots`` for the table's next ``num_new`` tokens, checked, then "computed"."""
        allocator, bs = self.allocator, self.bs
        before, num_free = list(table.blocks), allocator.num_free_blocks
        start, end = table.num_computed, table.num_computed + num_new
        slots = allocator.allocate_slots(
            table.blocks, start, num_new, computed, max_used_blocks=max_used_blocks
        )
        if slots is None:
            expect(
                table.blocks == before and allocator.num_free_blocks == num_free,
                "allocate_slots is all or nothing",
                f"it returned None but the table went from {before} to {table.blocks} and num_free_blocks "
                f"from {num_free} to {allocator.num_free_blocks}",
            )
            return False
        self._check_filled(table, before, computed, slots.block_copies, end)
        if max_used_blocks is not None:
            used = allocator.num_blocks - allocator.num_free_blocks
            expect(
                used <= max_used_blocks,
                "allocate_slots respects max_used_blocks",
                f"{used} blocks in use after it, max_used_blocks={max_used_blocks}",
            )
        for source, destination in slots.block_copies:  # the executor copies before the batch runs
            for j in range(bs):
                if (source, j) in self.slots:
                    self.slots[destination, j] = self.slots[source, j]
        others = Counter(b for other in self.tables if other is not table for b in other.blocks)
        for position in range(start, end):
            block = table.blocks[position // bs]
            expect(
                not others[block],
                "a block a table writes is held by no other table",
                f"position {position} goes to block {block}, which another table holds (no copy-on-write)",
            )
            self.slots[block, position % bs] = table.tokens[position]
        table.num_computed = end
        return True

    def _check_filled(self, table: Table, before: list[int], computed, copies, end: int) -> None:
        allocator, blocks = self.allocator, table.blocks
        expect(
            len(blocks) >= allocator.num_blocks_for(end),
            "allocate_slots fills the table",
            f"{len(blocks)} blocks hold {end} tokens of {self.bs} per block",
        )
        expect(
            all(0 <= b < allocator.num_blocks for b in blocks),
            "blocks are in the pool",
            f"table {blocks}, pool of {allocator.num_blocks}",
        )
        expect(len(set(blocks)) == len(blocks), "a table holds a block once", f"table {blocks}")
        kept = before or list(computed.block_ids if computed is not None else ())
        replaced = dict(copies)
        for i, block in enumerate(kept):
            expect(
                blocks[i] == block or replaced.get(block) == blocks[i],
                "a table's blocks never move",
                f"index {i} held {block}, now {blocks[i]}; block copies {list(copies)}",
            )

    def check_counts(self) -> None:
        allocator = self.allocator
        held = {b for table in self.tables for b in table.blocks}
        expect(
            allocator.num_free_blocks == allocator.num_blocks - len(held),
            "free blocks are the pool minus the held ones",
            f"num_free_blocks={allocator.num_free_blocks}, pool {allocator.num_blocks}, {len(held)} held",
        )

    def check_tables_intact(self) -> None:
        for table in self.tables:
            for position in range(table.num_computed):
                block = table.blocks[position // self.bs]
                held = self.slots.get((block, position % self.bs))
                expect(
                    held == table.tokens[position],
                    "what a table computed stays in its blocks",
                    f"position {position} (block {block}) holds {held}, was {table.tokens[position]}",
                )

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


class AllocatorMachine(RuleBasedStateMachine):
    """Random start / extend / cache / free, checked after every rule."""

    def __init__(self) -> None:
        super().__init__()
        self.world = self.make_world()

    def make_world(self) -> World:
        raise NotImplementedError

    @rule(
        document=st.sampled_from(DOCUMENTS),
        length=st.sampled_from([4, 8]) | st.integers(1, 30),
        data=st.data(),
        max_used=st.sampled_from([None, None, 6.0, 9.5]),
    )
    def start(self, document, length, data, max_used):
        world, allocator = self.world, self.world.allocator
        table = Table(tokens=document[:length])
        computed = None
        if (
            allocator.has_prefix_cache
        ):  # as the scheduler asks: the last token is recomputed unless it can copy
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
