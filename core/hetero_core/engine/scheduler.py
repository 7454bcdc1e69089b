"""Scheduler: continuous batching over a paged KV pool.

Each step the policy orders the requests (``policy_runner``); then, within the budgets
(``max_batch_size`` sequences and ``max_total_tokens`` tokens per step, ``max_num_seqs`` running at
once, ``memory_threshold`` of the pool for new admissions):

1. running decodes (one token each), then running prefills (their next chunk of at most
   ``max_prefill_chunk`` tokens), each group in policy order: several prefills may be in flight and
   a long prompt never delays a decode by more than one chunk;
2. swapped sequences come back (their blocks copied in from the CPU swap space);
3. waiting sequences are admitted, starting from the longest cached prefix (prefix caching).

When a scheduled sequence needs a block and none is free, the running sequence ranked last by the
policy is preempted: ``recompute`` frees its blocks (prefilled again later, mostly from the prefix
cache), ``swap`` copies them to the CPU swap space first. The step lists the block copies (swap out,
swap in, copy-on-write) that the executor must do before running the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetero_core.engine.batch import Batch, slot_of
from hetero_core.engine.policy import SchedulerSnapshot
from hetero_core.engine.policy_runner import Plan, PolicyRunner, view_of
from hetero_core.engine.preemption import Preemptor
from hetero_core.engine.sequence import Sequence, SequenceStatus

PREFILL, DECODE = SequenceStatus.PREFILL, SequenceStatus.DECODE


@dataclass(frozen=True)
class SchedulerLimits:
    max_batch_size: int
    max_num_seqs: int
    max_total_tokens: int
    max_model_len: int
    memory_threshold: float
    max_prefill_chunk: int | None = None  # prompt tokens of one request per step (None: no cap)


@dataclass
class ScheduledStep:
    seqs: list[Sequence]
    num_new_tokens: list[int]
    batch: Batch
    preempted: list[Sequence] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device block, swap block)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (swap block, device block)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # (source, destination), copy-on-write


@dataclass(frozen=True)
class SchedulerStats:
    """Counters since the engine started (shown in the CLI's run summary)."""

    num_steps: int
    num_preemptions: int
    num_recompute_preemptions: int
    num_swap_preemptions: int
    num_swap_ins: int
    prefix_cache_queried_tokens: int
    prefix_cache_hit_tokens: int
    num_invalid_policy_decisions: int
    num_policy_hold_back_overrides: int  # steps whose hold-backs were ignored: nothing ran, all held back

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hit_tokens / self.prefix_cache_queried_tokens if self.prefix_cache_queried_tokens else 0.0


class Scheduler:
    def __init__(self, policy, allocator, limits: SchedulerLimits, *, policy_name: str | None = None,
                 prefix_caching: bool = False, can_copy_blocks: bool = False,
                 preemption_mode: str = "recompute", num_swap_blocks: int = 0) -> None:
        self.runner = PolicyRunner(policy, policy_name or getattr(policy, "name", type(policy).__name__))
        self.policy = policy
        self.allocator = allocator
        self.limits = limits
        # Prefix caching needs the allocator's cache methods; a fully cached prompt also needs the
        # executor's block copy (its last block is shared when the last token is recomputed).
        self.prefix_caching = prefix_caching and hasattr(allocator, "lookup_prefix")
        self.can_copy_blocks = can_copy_blocks and hasattr(allocator, "copy_on_write")
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.swapped: list[Sequence] = []
        self.preemptor = Preemptor(self, preemption_mode, num_swap_blocks)
        self.num_steps = 0

    # -- requests ---------------------------------------------------------------------------------
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
        if self.prefix_caching:  # a hint for policies; the real lookup happens at admission
            limit = seq.num_tokens if self.can_copy_blocks else seq.num_tokens - 1
            seq.num_cached_tokens = len(self.allocator.lookup_prefix(seq.token_ids(0, limit))) * self.allocator.block_size
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Drop a sequence (finished or aborted) and free its blocks (they stay in the prefix cache)."""
        for queue in (self.running, self.waiting, self.swapped):
            if seq in queue:
                queue.remove(seq)
                break
        self.cache_computed_blocks(seq)
        self.allocator.free(seq.block_table)
        self.preemptor.release_swap(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def cache_computed_blocks(self, seq: Sequence) -> None:
        if self.prefix_caching and seq.block_table:
            self.allocator.cache_full_blocks(seq.block_table, seq.num_computed_tokens, seq.token_ids)

    def stats(self) -> SchedulerStats:
        preemptor = self.preemptor
        return SchedulerStats(
            num_steps=self.num_steps,
            num_preemptions=preemptor.num_recompute_preemptions + preemptor.num_swap_preemptions,
            num_recompute_preemptions=preemptor.num_recompute_preemptions,
            num_swap_preemptions=preemptor.num_swap_preemptions,
            num_swap_ins=preemptor.num_swap_ins,
            prefix_cache_queried_tokens=getattr(self.allocator, "num_queried_tokens", 0),
            prefix_cache_hit_tokens=getattr(self.allocator, "num_hit_tokens", 0),
            num_invalid_policy_decisions=self.runner.num_invalid_decisions,
            num_policy_hold_back_overrides=self.runner.num_hold_back_overrides,
        )

    def snapshot(self) -> SchedulerSnapshot:
        allocator, limits = self.allocator, self.limits
        return SchedulerSnapshot(
            step=self.num_steps,
            waiting=tuple(view_of(s) for s in self.waiting),
            running=tuple(view_of(s) for s in self.running),
            swapped=tuple(view_of(s) for s in self.swapped),
            num_free_blocks=allocator.num_free_blocks,
            num_cached_blocks=getattr(allocator, "num_cached_blocks", 0),
            num_total_blocks=allocator.num_blocks,
            block_size=allocator.block_size,
            max_num_batched_tokens=limits.max_total_tokens,
            max_batch_size=limits.max_batch_size,
            max_num_seqs=limits.max_num_seqs,
        )

    # -- the step ---------------------------------------------------------------------------------
    def schedule(self) -> ScheduledStep | None:
        self.num_steps += 1
        for seq in self.running:
            self.cache_computed_blocks(seq)
        plan = self.runner.plan(self.snapshot(), self.waiting + self.swapped)
        step = _StepBuilder(self.limits.max_total_tokens)
        for request_id in plan.preempt:
            seq = next((s for s in self.running if s.request_id == request_id), None)
            if seq is not None:
                self.preemptor.preempt(seq, step)

        rank = plan.rank
        for seq in sorted(self.running, key=lambda s: (s.status is PREFILL, rank[s.request_id])):
            if seq.status not in (PREFILL, DECODE):  # preempted earlier in this loop
                continue
            if step.is_full(self.limits.max_batch_size):
                break
            num_new = self._num_new_tokens(seq, seq.num_computed_tokens, step.token_budget)
            if self.preemptor.make_room(seq, num_new, step, rank):
                self._grow(seq, num_new, step)
        if not step.preempted:
            self._swap_in(step, plan)
            if not any(s.request_id not in plan.hold_back for s in self.swapped):
                self._admit(step, plan)
        return step.build(self)

    def _num_new_tokens(self, seq: Sequence, start: int, token_budget: int) -> int:
        num_new = min(seq.num_tokens - start, token_budget)
        cap = self.limits.max_prefill_chunk
        return min(num_new, cap) if cap is not None and num_new > 1 else num_new

    def _grow(self, seq: Sequence, num_new: int, step: _StepBuilder) -> None:
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + num_new
        if self.can_copy_blocks:
            step.block_copies += self.allocator.copy_on_write(seq.block_table, start, end)
        self.allocator.grow(seq.block_table, end)
        step.add(seq, num_new)

    def _swap_in(self, step: _StepBuilder, plan: Plan) -> None:
        for seq in sorted(self.swapped, key=lambda s: plan.rank[s.request_id]):
            if seq.request_id in plan.hold_back:
                continue
            if step.is_full(self.limits.max_batch_size) or len(self.running) >= self.limits.max_num_seqs:
                return
            num_new = self._num_new_tokens(seq, seq.num_computed_tokens, step.token_budget)
            if not self.preemptor.swap_in(seq, seq.num_computed_tokens + num_new, step):
                return
            self.swapped.remove(seq)
            self.running.append(seq)
            self._grow(seq, num_new, step)

    def _admit(self, step: _StepBuilder, plan: Plan) -> None:
        allocator = self.allocator
        limit_blocks = self.limits.memory_threshold * allocator.num_blocks
        for seq in sorted(self.waiting, key=lambda s: plan.rank[s.request_id]):
            if seq.request_id in plan.hold_back:
                continue
            if step.is_full(self.limits.max_batch_size) or len(self.running) >= self.limits.max_num_seqs:
                return
            hits = self._cached_prefix(seq)
            num_cached = len(hits) * allocator.block_size
            start = min(num_cached, seq.num_tokens - 1)  # at least one token runs, to sample from
            num_new = self._num_new_tokens(seq, start, step.token_budget)
            if hits:
                needed = allocator.num_blocks_to_acquire(hits, start + num_new)
                needed += int(start < num_cached and allocator.ref_count(hits[-1]) > 0)  # copy-on-write
            else:
                needed = allocator.num_new_blocks(seq.block_table, start + num_new)
            if needed > allocator.num_free_blocks:
                return
            # Keep headroom for running sequences to grow; with nothing running, anything that fits goes.
            if self.running and allocator.num_used_blocks + needed > limit_blocks:
                return
            if self.prefix_caching:
                allocator.acquire_prefix(seq.block_table, hits)
                allocator.record_lookup(seq.num_tokens, start)
            seq.num_computed_tokens = seq.num_cached_tokens = start
            seq.status = PREFILL
            self.waiting.remove(seq)
            self.running.append(seq)
            self._grow(seq, num_new, step)

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        if not self.prefix_caching:
            return []
        limit = seq.num_tokens if self.can_copy_blocks else seq.num_tokens - 1
        return self.allocator.lookup_prefix(seq.token_ids(0, limit))


class _StepBuilder:
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

    def add(self, seq: Sequence, num_new: int) -> None:
        self.chosen.append((seq, num_new))
        self.scheduled_ids.add(seq.seq_id)
        self.token_budget -= num_new

    def build(self, scheduler: Scheduler) -> ScheduledStep | None:
        pending = scheduler.preemptor.take_pending()
        if not self.chosen:
            scheduler.preemptor.keep_pending(self.preempted, self.swap_out, pending)
            return None
        return ScheduledStep(
            seqs=[s for s, _ in self.chosen],
            num_new_tokens=[n for _, n in self.chosen],
            batch=_build_batch(self.chosen, scheduler.allocator.block_size),
            preempted=pending.preempted + self.preempted,
            swap_out=pending.swap_out + self.swap_out,
            swap_in=self.swap_in,
            block_copies=self.block_copies,
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
    return Batch(
        seq_ids=[s.seq_id for s, _ in chosen],
        token_ids=token_ids,
        positions=positions,
        slot_mapping=slots,
        query_start_loc=starts,
        context_lens=context_lens,
        block_tables=[list(s.block_table) for s, _ in chosen],
        is_prefill=[s.status is PREFILL for s, _ in chosen],
        sample=[s.num_computed_tokens + n == s.num_tokens for s, n in chosen],
        num_prompt_tokens=[s.num_prompt_tokens for s, _ in chosen],
        seeds=[s.params.seed for s, _ in chosen],
        block_size=block_size,
    )
