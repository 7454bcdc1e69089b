"""ContractExecutor: the policy kit's own executor (deterministic, no model, no torch, no plugin package).

It keeps token ids in a paged cache, as attention keeps K/V: every scheduled token is written to the
slot the batch names, and a sampled sequence's whole context is read back through its block table.
The next token is a hash of that context, so it depends only on the tokens before it, never on the
batch, the block ids or preemption, and a lost or misplaced block changes the output. Block copies
and swaps move slots, so prefix caching and swap preemption run as on a real executor.
"""

from __future__ import annotations

import zlib
from array import array

from hetero_core.executor import Batch, ExecutorCapabilities, ExecutorContext, ExecutorOutput, slot_of

EMPTY = -1
FIRST_TOKEN_ID, LAST_TOKEN_ID = 32, 126  # printable ASCII: the byte tokenizer decodes every token


class ContractExecutor:
    capabilities = ExecutorCapabilities(block_copy=True, block_swap=True)

    def __init__(self, ctx: ExecutorContext) -> None:
        self.block_size = ctx.block_size
        self.slots = array("q", [EMPTY]) * (ctx.num_blocks * ctx.block_size)
        self.swap_slots = array("q", [EMPTY]) * (ctx.num_swap_blocks * ctx.block_size)
        self.batches: list[Batch] = []  # every batch, in order (the kit compares schedules)

    def execute(self, batch: Batch) -> ExecutorOutput:
        self.batches.append(batch)
        for slot, token in zip(batch.slot_mapping, batch.token_ids):
            self.slots[slot] = token
        return ExecutorOutput(token_ids=[self._next_token(batch, i) for i in batch.sample_indices])

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        self._move(self.slots, self.slots, pairs)

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        self._move(self.slots, self.swap_slots, pairs)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        self._move(self.swap_slots, self.slots, pairs)

    def shutdown(self) -> None:
        pass

    def _next_token(self, batch: Batch, i: int) -> int:
        table, size = batch.block_tables[i], self.block_size
        context = array("q", (self.slots[slot_of(table, pos, size)] for pos in range(batch.context_lens[i])))
        if EMPTY in context:
            raise RuntimeError(f"sequence {batch.seq_ids[i]} reads a KV slot nothing wrote (an engine bug)")
        return FIRST_TOKEN_ID + zlib.crc32(context.tobytes()) % (LAST_TOKEN_ID - FIRST_TOKEN_ID + 1)

    def _move(self, source: array, destination: array, pairs: list[tuple[int, int]]) -> None:
        size = self.block_size
        for src, dst in pairs:
            destination[dst * size : (dst + 1) * size] = source[src * size : (src + 1) * size]
