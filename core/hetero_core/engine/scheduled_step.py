"""ScheduledStep: one engine step's work, as the scheduler hands it to the engine.

The sequences to run and their new tokens, the batch built from them, the sequences preempted this step,
and the block transfers the executor runs before the batch (swap out, swap in, copy-on-write copies;
``engine/block_transfer.py``). A step may schedule nothing and still carry swap-outs (its
preemptions made room for the next step): the engine applies them at once, so nothing carries over.
``is_stalled`` says that nothing was scheduled and nothing ever will be (see ``Scheduler.schedule``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetero_core.engine.batch import Batch, slot_of
from hetero_core.engine.kv_allocator import SlotAllocation
from hetero_core.engine.sequence import Sequence, SequenceStatus

__all__ = ["ScheduledStep", "StepBuilder"]


@dataclass
class ScheduledStep:
    seqs: list[Sequence]
    num_new_tokens: list[int]
    batch: Batch | None  # None when nothing was scheduled
    preempted: list[Sequence] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device block, swap block)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (swap block, device block)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # (source, destination), copy-on-write
    is_stalled: bool = False  # nothing scheduled, requests wait, and nothing will change


class StepBuilder:
    """The sequences chosen so far this step, the tokens left, and the block operations."""

    def __init__(self, token_budget: int) -> None:
        self.token_budget = token_budget
        self.chosen: list[tuple[Sequence, int]] = []
        self.scheduled_ids: set[int] = set()
        self.preempted: list[Sequence] = []
        self.swap_out: list[tuple[int, int]] = []
        self.swap_in: list[tuple[int, int]] = []
        self.block_copies: list[tuple[int, int]] = []

    def is_full(self, max_batch_size: int) -> bool:
        return len(self.chosen) == max_batch_size or self.token_budget == 0

    def add(self, seq: Sequence, num_new: int, slots: SlotAllocation) -> None:
        self.chosen.append((seq, num_new))
        self.scheduled_ids.add(seq.seq_id)
        self.token_budget -= num_new
        if slots.block_copies:
            self.block_copies += slots.block_copies

    def build(self, block_size: int, earlier: StepBuilder | None = None, is_stalled: bool = False) -> ScheduledStep:
        """The step; ``earlier``: a pass of the same step that scheduled nothing (its preemptions
        and swap-outs come first)."""
        preempted, swap_out = self.preempted, self.swap_out
        if earlier is not None:
            preempted, swap_out = earlier.preempted + preempted, earlier.swap_out + swap_out
        chosen = self.chosen
        return ScheduledStep(
            seqs=[s for s, _ in chosen],
            num_new_tokens=[n for _, n in chosen],
            batch=_build_batch(chosen, block_size) if chosen else None,
            preempted=preempted,
            swap_out=swap_out,
            swap_in=self.swap_in,
            block_copies=self.block_copies,
            is_stalled=is_stalled,
        )


def _build_batch(chosen: list[tuple[Sequence, int]], block_size: int) -> Batch:
    token_ids, positions, slots, starts, context_lens = [], [], [], [0], []
    for seq, num_new in chosen:
        first = seq.num_computed_tokens
        table = seq.block_table
        token_ids += seq.token_ids(first, first + num_new)
        for pos in range(first, first + num_new):
            positions.append(pos)
            slots.append(slot_of(table, pos, block_size))
        starts.append(starts[-1] + num_new)
        context_lens.append(first + num_new)
    prefill = SequenceStatus.PREFILL
    return Batch(
        seq_ids=[s.seq_id for s, _ in chosen],
        token_ids=token_ids,
        positions=positions,
        slot_mapping=slots,
        query_start_loc=starts,
        context_lens=context_lens,
        block_tables=[list(s.block_table) for s, _ in chosen],
        is_prefill=[s.status is prefill for s, _ in chosen],
        sample=[s.num_computed_tokens + n == s.num_tokens for s, n in chosen],
        num_prompt_tokens=[s.num_prompt_tokens for s, _ in chosen],
        seeds=[s.params.seed for s, _ in chosen],
        block_size=block_size,
    )
