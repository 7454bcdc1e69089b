"""Preemption: making room when the KV pool runs out, by recompute or by swap.

- ``recompute``: the victim's blocks are freed (full ones stay in the prefix cache) and it waits to be
  prefilled again, prompt and generated tokens together.
- ``swap``: the victim's blocks are copied to the CPU swap space (``num_swap_blocks``) and it keeps its
  computed tokens; it comes back (blocks copied in) before new requests are admitted. A victim that
  does not fit in the swap space falls back to recompute.

Either way its sampled tokens are kept, so it finishes with the tokens it would have produced without
preemption. Every preemption is logged (``request.preempted``) and counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetero_core.engine.sequence import Sequence, SequenceStatus
from hetero_core.engine.swap import SwapSpace
from hetero_core.logging import get_logger

log = get_logger("hetero.scheduler")
PREEMPTION_MODES = ("recompute", "swap")


@dataclass
class _Pending:
    """Preemptions of a step that scheduled nothing: reported and copied with the next step."""

    preempted: list[Sequence] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)


class Preemptor:
    def __init__(self, scheduler, mode: str, num_swap_blocks: int) -> None:
        if mode not in PREEMPTION_MODES:
            raise ValueError(f"unknown preemption_mode {mode!r}; valid options are: {', '.join(PREEMPTION_MODES)}")
        self.scheduler = scheduler
        self.mode = mode
        self.swap_space = SwapSpace(num_swap_blocks) if mode == "swap" else None
        self.num_recompute_preemptions = 0
        self.num_swap_preemptions = 0
        self.num_swap_ins = 0
        self._pending = _Pending()

    def make_room(self, seq: Sequence, num_new: int, step, rank: dict[str, int]) -> bool:
        """Preempt the lowest-ranked unscheduled running sequences until ``seq`` can grow by
        ``num_new`` tokens. Returns False if ``seq`` itself had to be preempted."""
        scheduler, allocator = self.scheduler, self.scheduler.allocator
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + num_new
        while True:
            needed = allocator.num_new_blocks(seq.block_table, end)
            if scheduler.can_copy_blocks:
                needed += allocator.num_shared_blocks(seq.block_table, start, end)
            if needed <= allocator.num_free_blocks:
                return True
            candidates = [c for c in scheduler.running if c.seq_id not in step.scheduled_ids]
            victim = max(candidates, key=lambda c: rank[c.request_id])
            self.preempt(victim, step)
            if victim is seq:
                return False

    def preempt(self, seq: Sequence, step) -> None:
        scheduler, allocator = self.scheduler, self.scheduler.allocator
        scheduler.running.remove(seq)
        scheduler.cache_computed_blocks(seq)
        # Blocks that hold computed K/V (a contiguous reservation also holds empty ones, not copied)
        num_blocks = min(len(seq.block_table), allocator.num_blocks_for(seq.num_computed_tokens))
        space = self.swap_space
        if space is not None and seq.num_computed_tokens and num_blocks <= space.num_free_blocks:
            seq.swap_table = space.allocate(num_blocks)
            step.swap_out += zip(seq.block_table, seq.swap_table)
            allocator.free(seq.block_table)
            seq.status = SequenceStatus.SWAPPED
            seq.num_preemptions += 1
            scheduler.swapped.append(seq)
            self.num_swap_preemptions += 1
            mode = "swap"
        else:
            allocator.free(seq.block_table)
            seq.reset_for_recompute()
            scheduler.waiting.append(seq)
            self.num_recompute_preemptions += 1
            mode = "recompute"
        step.preempted.append(seq)
        log.info("request.preempted", request_id=seq.request_id, mode=mode, num_blocks=num_blocks,
                 num_computed_tokens=seq.num_computed_tokens, num_preemptions=seq.num_preemptions)

    def swap_in(self, seq: Sequence, num_tokens: int, step) -> bool:
        """Give ``seq`` device blocks for its swapped ones (and room for ``num_tokens``); False if the
        pool has no room now."""
        allocator = self.scheduler.allocator
        num_swapped = len(seq.swap_table)
        num_tokens = max(num_swapped * allocator.block_size, num_tokens)
        if allocator.num_new_blocks(seq.block_table, num_tokens) > allocator.num_free_blocks:
            return False
        allocator.grow(seq.block_table, num_swapped * allocator.block_size)
        step.swap_in += zip(seq.swap_table, seq.block_table)
        self.swap_space.free(seq.swap_table)
        is_decode = seq.num_uncomputed_tokens == 1 and seq.output_token_ids
        seq.status = SequenceStatus.DECODE if is_decode else SequenceStatus.PREFILL
        self.num_swap_ins += 1
        return True

    def release_swap(self, seq: Sequence) -> None:
        if seq.swap_table:
            self.swap_space.free(seq.swap_table)

    def take_pending(self) -> _Pending:
        pending, self._pending = self._pending, _Pending()
        return pending

    def keep_pending(self, preempted: list[Sequence], swap_out: list[tuple[int, int]], earlier: _Pending) -> None:
        self._pending = _Pending(earlier.preempted + preempted, earlier.swap_out + swap_out)
