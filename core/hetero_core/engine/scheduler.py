"""Scheduler: continuous batching over a paged KV pool.

Each step, running sequences come first (decodes, then unfinished prefills, in policy order), then
waiting ones are admitted in policy order while the budgets allow: ``max_batch_size`` sequences and
``max_total_tokens`` tokens per step, ``max_num_seqs`` running at once, and ``memory_threshold`` of
the pool for new admissions. A prompt longer than the token budget left is prefilled in chunks. When a
running sequence needs a block and none is free, the lowest-priority running sequence is preempted
(its blocks freed, to be recomputed later).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetero_core.engine.batch import Batch
from hetero_core.engine.policy import SchedulerPolicy
from hetero_core.engine.sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class SchedulerLimits:
    max_batch_size: int
    max_num_seqs: int
    max_total_tokens: int
    max_model_len: int
    memory_threshold: float


@dataclass
class ScheduledStep:
    seqs: list[Sequence]
    num_new_tokens: list[int]
    batch: Batch
    preempted: list[Sequence] = field(default_factory=list)


class Scheduler:
    def __init__(self, policy: SchedulerPolicy, allocator, limits: SchedulerLimits) -> None:
        self.policy = policy
        self.allocator = allocator
        self.limits = limits
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []

    def admission_error(self, seq: Sequence) -> str | None:
        """Why ``seq`` can never run, or None. Checked once, when the request arrives."""
        total = seq.num_prompt_tokens + seq.params.max_tokens
        if total > self.limits.max_model_len:
            return (
                f"prompt ({seq.num_prompt_tokens} tokens) + max_tokens ({seq.params.max_tokens}) = "
                f"{total} exceeds max_model_len ({self.limits.max_model_len})"
            )
        blocks = self.allocator.num_blocks_for(total)
        if blocks > self.allocator.num_blocks:
            return (
                f"request needs {blocks} KV blocks ({total} tokens) but the whole pool has "
                f"{self.allocator.num_blocks} (max_num_blocks)"
            )
        return None

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Drop a sequence (finished or aborted) and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.allocator.free(seq.block_table)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledStep | None:
        token_budget = self.limits.max_total_tokens
        chosen: list[tuple[Sequence, int]] = []
        preempted: list[Sequence] = []

        # Decodes first (one token each), then unfinished prefills; each group in policy order.
        def decode_first(seq: Sequence):
            return (seq.status is SequenceStatus.PREFILL, self.policy.priority(seq))

        for seq in sorted(self.running, key=decode_first):
            if seq not in self.running:  # preempted earlier in this loop
                continue
            if len(chosen) == self.limits.max_batch_size or token_budget == 0:
                break
            num_new = min(seq.num_uncomputed_tokens, token_budget)
            if self._make_room(seq, num_new, chosen, preempted):
                self.allocator.grow(seq.block_table, seq.num_computed_tokens + num_new)
                chosen.append((seq, num_new))
                token_budget -= num_new

        if not preempted:
            token_budget = self._admit(chosen, token_budget)
        if not chosen:
            return None
        return ScheduledStep(
            seqs=[s for s, _ in chosen],
            num_new_tokens=[n for _, n in chosen],
            batch=self._build_batch(chosen),
            preempted=preempted,
        )

    def _make_room(self, seq, num_new, chosen, preempted) -> bool:
        """Preempt lowest-priority unscheduled running sequences until ``seq`` fits.

        Returns False if ``seq`` itself had to be preempted.
        """
        target = seq.num_computed_tokens + num_new
        scheduled = {id(s) for s, _ in chosen}
        while not self.allocator.can_grow(seq.block_table, target):
            candidates = [s for s in self.running if id(s) not in scheduled]
            victim = max(candidates, key=self.policy.priority)
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.allocator.free(seq.block_table)
        seq.reset_for_recompute()
        self.waiting.append(seq)

    def _admit(self, chosen: list[tuple[Sequence, int]], token_budget: int) -> int:
        limit_blocks = self.limits.memory_threshold * self.allocator.num_blocks
        for seq in sorted(self.waiting, key=self.policy.priority):
            if len(chosen) == self.limits.max_batch_size or token_budget == 0:
                break
            if len(self.running) >= self.limits.max_num_seqs:
                break
            num_new = min(seq.num_uncomputed_tokens, token_budget)
            needed = self.allocator.num_new_blocks(seq.block_table, num_new)
            if not self.allocator.can_grow(seq.block_table, num_new):
                break
            # Keep headroom for running sequences to grow; with nothing running, anything that fits goes.
            if self.running and self.allocator.num_used_blocks + needed > limit_blocks:
                break
            self.allocator.grow(seq.block_table, num_new)
            self.waiting.remove(seq)
            self.running.append(seq)
            seq.status = SequenceStatus.PREFILL
            chosen.append((seq, num_new))
            token_budget -= num_new
        return token_budget

    def _build_batch(self, chosen: list[tuple[Sequence, int]]) -> Batch:
        block_size = self.allocator.block_size
        token_ids, positions, slots, starts, context_lens = [], [], [], [0], []
        for seq, num_new in chosen:
            first = seq.num_computed_tokens
            table = seq.block_table
            for pos in range(first, first + num_new):
                token_ids.append(seq.token_id(pos))
                positions.append(pos)
                slots.append(table[pos // block_size] * block_size + pos % block_size)
            starts.append(starts[-1] + num_new)
            context_lens.append(first + num_new)
        return Batch(
            seq_ids=[s.seq_id for s, _ in chosen],
            token_ids=token_ids,
            positions=positions,
            slot_mapping=slots,
            query_start_loc=starts,
            context_lens=context_lens,
            block_tables=[list(s.block_table) for s, _ in chosen],
            is_prefill=[s.status is SequenceStatus.PREFILL for s, _ in chosen],
            sample=[s.num_computed_tokens + n == s.num_tokens for s, n in chosen],
            num_prompt_tokens=[s.num_prompt_tokens for s, _ in chosen],
            seeds=[s.params.seed for s, _ in chosen],
            block_size=block_size,
        )
