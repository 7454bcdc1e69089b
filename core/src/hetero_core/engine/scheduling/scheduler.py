"""Scheduler: continuous batching over a paged KV pool.

Each step the policy orders the requests (``policy_runner``); then, within the budgets
(``max_batch_size`` sequences and ``max_total_tokens`` tokens per step, ``max_num_seqs`` running at
once, ``memory_threshold`` of the pool for new admissions):

1. running decodes (one token each, plus the proposals to verify of a speculating one where the
   budget and the pool have room: ``_room_for_proposals``), then running prefills (their next chunk of at most
   ``max_prefill_chunk`` tokens), each group in policy order: several prefills may be in flight and
   a long prompt never delays a decode by more than one chunk;
2. swapped sequences come back (their blocks copied in from the CPU swap space);
3. waiting sequences are admitted, starting from the longest cached prefix (prefix caching).

The KV allocator answers whole questions (``engine/kv/kv_allocator.py``): the cached prefix of a request
(``get_computed_blocks``) and room for a sequence's next tokens, all or nothing (``allocate_slots``,
which also returns the copy-on-write pairs). When a running sequence gets no room, the running
sequence ranked last by the policy is preempted (``preemption.choose_victim``): ``recompute`` frees its
blocks (prefilled again later, mostly from the prefix cache), ``swap`` copies them to the CPU swap
space first. The step lists the block copies (swap out, swap in, copy-on-write) that the executor
must do before running the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from hetero_core.engine.kv.kv_allocator import NO_COMPUTED_BLOCKS, ComputedBlocks, KVAllocator, SlotAllocation
from hetero_core.engine.requests.sequence import Sequence, SequenceStatus
from hetero_core.engine.scheduling.batch_builder import BatchBuilder
from hetero_core.engine.scheduling.policy import SchedulerSnapshot
from hetero_core.engine.scheduling.policy_keys import view_of
from hetero_core.engine.scheduling.policy_runner import Plan, PolicyRunner
from hetero_core.engine.scheduling.preemption import Preemptor, choose_victim
from hetero_core.engine.scheduling.scheduled_step import ScheduledStep, StepBuilder
from hetero_core.engine.scheduling.scheduler_stats import SchedulerStats
from hetero_core.logging import get_logger

__all__ = ["ScheduledStep", "Scheduler", "SchedulerLimits", "SchedulerStats"]
log = get_logger("hetero.scheduler")
PREFILL, DECODE, SWAPPED = SequenceStatus.PREFILL, SequenceStatus.DECODE, SequenceStatus.SWAPPED
RUNNING = (PREFILL, DECODE)
_by_rank = attrgetter("rank")


@dataclass(frozen=True)
class SchedulerLimits:
    max_batch_size: int
    max_num_seqs: int
    max_total_tokens: int
    max_model_len: int
    memory_threshold: float
    max_prefill_chunk: int | None = None  # prompt tokens of one request per step (None: no cap)


class Scheduler:
    def __init__(
        self,
        policy,
        allocator: KVAllocator,
        limits: SchedulerLimits,
        *,
        policy_name: str | None = None,
        prefix_caching: bool = False,
        can_copy_blocks: bool = False,
        preemption_mode: str = "recompute",
        num_swap_blocks: int = 0,
    ) -> None:
        self.runner = PolicyRunner(policy, policy_name or getattr(policy, "name", type(policy).__name__))
        self.policy = policy
        self.allocator = allocator
        self.limits = limits
        # Prefix caching needs an allocator that keeps a prefix cache; a fully cached prompt also needs
        # copy-on-write from the allocator and the executor (its last block is shared when the last
        # token is recomputed). Both are declared, never probed.
        self.prefix_caching = prefix_caching and allocator.has_prefix_cache
        self.can_copy_blocks = can_copy_blocks and allocator.has_copy_on_write
        self.batches = BatchBuilder(allocator.block_size)
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        # Pipelined steps (the engine keeps two in flight): a running sequence whose next token is
        # still pending (its step has not come back) waits for it instead of taking a placeholder,
        # so the steps in flight hold disjoint sequences; and a step takes at most half the
        # sequences (running, waiting, swapped), so both steps in flight have work.
        self.skip_pending = False
        self._step_limit = limits.max_batch_size
        self.swapped: list[Sequence] = []
        self.preemptor = Preemptor(preemption_mode, num_swap_blocks)
        self.num_steps = 0
        self.num_recompute_preemptions = self.num_swap_preemptions = self.num_swap_ins = 0
        self.num_prefix_queried_tokens = self.num_prefix_hit_tokens = 0
        self.last_step_num_seqs = self.last_step_num_tokens = 0

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

    def unschedulable_error(self, seq: Sequence) -> str:
        """Why ``seq`` waits forever, for a step that ``is_stalled``."""
        allocator = self.allocator
        return (
            f"request can never be scheduled: it needs {allocator.num_blocks_for(seq.num_tokens)} KV "
            "blocks for "
            f"{seq.num_tokens} tokens, {allocator.num_free_blocks} of {allocator.num_blocks} are free and "
            "nothing else is running"
        )

    def add(self, seq: Sequence) -> None:
        seq.num_cached_tokens = self._computed_blocks(seq).num_tokens  # a hint for policies
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Drop a sequence (finished or aborted) and free its blocks (those a completed step wrote
        stay in the prefix cache)."""
        for queue in (self.running, self.waiting, self.swapped):
            if seq in queue:
                queue.remove(seq)
                break
        self._cache_computed_blocks(seq)
        self._free(seq)
        self.preemptor.release(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def stats(self, num_queued_tokens: int = 0) -> SchedulerStats:
        """The counters; ``num_queued_tokens`` comes from the engine (it sees the output tokens)."""
        allocator, runner = self.allocator, self.runner
        return SchedulerStats(
            num_steps=self.num_steps,
            num_preemptions=self.num_recompute_preemptions + self.num_swap_preemptions,
            num_recompute_preemptions=self.num_recompute_preemptions,
            num_swap_preemptions=self.num_swap_preemptions,
            num_swap_ins=self.num_swap_ins,
            prefix_cache_queried_tokens=self.num_prefix_queried_tokens,
            prefix_cache_hit_tokens=self.num_prefix_hit_tokens,
            num_invalid_policy_decisions=runner.num_invalid_decisions,
            num_policy_hold_back_overrides=runner.num_hold_back_overrides,
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_swapped=len(self.swapped),
            num_blocks=allocator.num_blocks,
            num_free_blocks=allocator.num_free_blocks,
            num_cached_blocks=allocator.num_cached_blocks,
            last_step_num_seqs=self.last_step_num_seqs,
            last_step_num_tokens=self.last_step_num_tokens,
            num_queued_tokens=num_queued_tokens,
        )

    def snapshot(self) -> SchedulerSnapshot:
        allocator, limits = self.allocator, self.limits
        return SchedulerSnapshot(
            step=self.num_steps,
            waiting=tuple(view_of(s) for s in self.waiting),
            running=tuple(view_of(s) for s in self.running),
            swapped=tuple(view_of(s) for s in self.swapped),
            num_free_blocks=allocator.num_free_blocks,
            num_cached_blocks=allocator.num_cached_blocks,
            num_total_blocks=allocator.num_blocks,
            block_size=allocator.block_size,
            max_num_batched_tokens=limits.max_total_tokens,
            max_batch_size=limits.max_batch_size,
            max_num_seqs=limits.max_num_seqs,
        )

    # -- the step ---------------------------------------------------------------------------------
    def schedule(self) -> ScheduledStep:
        """One engine step's work. A pass that schedules nothing while requests remain (it only
        preempted, making room, or the policy held every request back) is followed at once by a
        second; if that one schedules nothing either, the step ``is_stalled`` unless the policy is
        holding requests back (its hold-backs are overridden after a bounded number of steps).

        Sequences whose next token is pending (sampled by a step not completed yet, with async
        scheduling) are planned as if they had it; one that this token will end by length is not
        scheduled again, and one that waits or is swapped out is not brought back until its token
        is known."""
        first = self._schedule_pass()
        if first.chosen or not self.has_work:
            return self._finish_step(first.build(self.batches))
        second = self._schedule_pass()
        is_stalled = not second.chosen and not self.runner.num_idle_steps
        return self._finish_step(second.build(self.batches, earlier=first, is_stalled=is_stalled))

    def _finish_step(self, step: ScheduledStep) -> ScheduledStep:
        self.last_step_num_seqs = len(step.seqs)
        self.last_step_num_tokens = step.batch.num_tokens if step.batch is not None else 0
        return step

    def _schedule_pass(self) -> StepBuilder:
        self.num_steps += 1
        if self.prefix_caching:
            for seq in self.running:
                self._cache_computed_blocks(seq)
        plan = self.runner.plan(self.running, self.waiting, self.swapped, self.snapshot)
        step = StepBuilder(self.limits.max_total_tokens)
        for request_id in plan.preempt:
            seq = next((s for s in self.running if s.request_id == request_id), None)
            if seq is not None:
                self._preempt(seq, step)

        self._step_limit = self._step_seq_limit()
        max_batch_size, max_model_len = self._step_limit, self.limits.max_model_len
        for seq in sorted(self.running, key=_running_order):
            if seq.status not in RUNNING:  # preempted earlier in this loop
                continue
            if step.is_full(max_batch_size):
                break
            if seq.num_pending_tokens and (self.skip_pending or _ends_with_pending(seq, max_model_len)):
                continue
            num_new = self._num_new_tokens(seq, seq.num_computed_tokens, step.token_budget)
            spec, slots = seq.spec_token_ids, None
            if spec:  # proposals to verify (speculative decoding): only where they fit, never by preempting
                seq.spec_token_ids = ()
                spec, slots = self._room_for_proposals(seq, spec, step.token_budget - num_new)
            if slots is None:
                slots = self._make_room(seq, num_new, step)
            if slots is not None:
                step.add(seq, num_new + len(spec), slots, spec)
        if not step.preempted:
            self._swap_in(step, plan)
            if not any(s.request_id not in plan.hold_back for s in self.swapped):
                self._admit(step, plan)
        return step

    def _step_seq_limit(self) -> int:
        """Sequences one step may take: ``max_batch_size``; with pipelined steps, at most half of
        those the scheduler holds (rounded up), the other half going to the other step in flight."""
        if not self.skip_pending:
            return self.limits.max_batch_size
        held = len(self.running) + len(self.waiting) + len(self.swapped)
        return max(1, min(self.limits.max_batch_size, -(-held // 2)))

    def _num_new_tokens(self, seq: Sequence, start: int, token_budget: int) -> int:
        num_new = min(
            len(seq.prompt_token_ids) + len(seq.output_token_ids) + seq.num_pending_tokens - start,
            token_budget,
        )  # seq.num_scheduled_tokens, inline: it runs per sequence per step
        cap = self.limits.max_prefill_chunk
        return min(num_new, cap) if cap is not None and num_new > 1 else num_new

    def _room_for_proposals(
        self, seq: Sequence, spec: tuple[int, ...], token_budget: int
    ) -> tuple[tuple[int, ...], SlotAllocation | None]:
        """Room for a decode's token and as many of its proposals as the token budget and the free
        blocks allow: all of them, else those that fit the blocks its table holds, else none ((), None)."""
        num_spec = min(len(spec), token_budget)
        while num_spec > 0:
            slots = self.allocator.allocate_slots(seq.block_table, seq.num_computed_tokens, 1 + num_spec)
            if slots is not None:
                return spec[:num_spec], slots
            spare = len(seq.block_table) * self.allocator.block_size - seq.num_computed_tokens - 1
            num_spec = min(num_spec - 1, spare)
        return (), None

    def _make_room(self, seq: Sequence, num_new: int, step: StepBuilder) -> SlotAllocation | None:
        """Room for ``seq``'s next ``num_new`` tokens, preempting the lowest-ranked unscheduled running
        sequences until it fits; None if ``seq`` itself had to be preempted."""
        while (
            slots := self.allocator.allocate_slots(seq.block_table, seq.num_computed_tokens, num_new)
        ) is None:
            victim = choose_victim(self.running, step.scheduled_ids)
            self._preempt(victim, step)
            if victim is seq:
                return None
        return slots

    def _preempt(self, seq: Sequence, step: StepBuilder) -> None:
        self.running.remove(seq)
        self._cache_computed_blocks(seq)
        preemption = self.preemptor.preempt(seq, self.allocator)
        self._free(seq)
        if preemption.mode == "swap":
            seq.swap_table = preemption.swap_table
            seq.status = SWAPPED
            seq.num_preemptions += 1
            self.swapped.append(seq)
            step.swap_out += preemption.swap_out
            step.swapped_out.append(seq)
            self.num_swap_preemptions += 1
        else:
            seq.reset_for_recompute()
            self.waiting.append(seq)
            self.num_recompute_preemptions += 1
        step.preempted.append(seq)
        log.info(
            "request.preempted",
            request_id=seq.request_id,
            mode=preemption.mode,
            num_blocks=preemption.num_blocks,
            num_computed_tokens=seq.num_computed_tokens,
            num_preemptions=seq.num_preemptions,
        )

    def _swap_in(self, step: StepBuilder, plan: Plan) -> None:
        for seq in sorted(self.swapped, key=_by_rank):
            if seq.request_id in plan.hold_back or seq.num_pending_tokens:
                continue
            if step.is_full(self._step_limit) or len(self.running) >= self.limits.max_num_seqs:
                return
            num_new = self._num_new_tokens(seq, seq.num_computed_tokens, step.token_budget)
            slots = self.allocator.allocate_slots(seq.block_table, seq.num_computed_tokens, num_new)
            if slots is None:  # the pool has no room now
                return
            step.add_swap_in(seq, self.preemptor.swap_in(seq))
            is_decode = seq.num_uncomputed_tokens == 1 and seq.output_token_ids
            seq.status = DECODE if is_decode else PREFILL
            self.num_swap_ins += 1
            self.swapped.remove(seq)
            self.running.append(seq)
            step.add(seq, num_new, slots)

    def _admit(self, step: StepBuilder, plan: Plan) -> None:
        max_used_blocks = self.limits.memory_threshold * self.allocator.num_blocks
        for seq in sorted(self.waiting, key=_by_rank):
            if seq.request_id in plan.hold_back or seq.num_pending_tokens:
                continue
            if step.is_full(self._step_limit) or len(self.running) >= self.limits.max_num_seqs:
                return
            computed = self._computed_blocks(seq)
            start = min(computed.num_tokens, seq.num_tokens - 1)  # at least one token runs, to sample from
            # A request with its prompt's K/V from another engine (kv_transfer.py): room for the rest of
            # the prompt and the first token; the prompt is imported, the first token runs.
            num_new = (
                seq.num_tokens - start
                if seq.kv_import is not None
                else self._num_new_tokens(seq, start, step.token_budget)
            )
            # Keep headroom for running sequences to grow; with nothing running, anything that fits goes.
            slots = self.allocator.allocate_slots(
                seq.block_table,
                start,
                num_new,
                computed,
                max_used_blocks=max_used_blocks if self.running else None,
            )
            if slots is None:
                return
            if self.prefix_caching:
                self.num_prefix_queried_tokens += seq.num_tokens
                self.num_prefix_hit_tokens += start
            seq.num_computed_tokens = seq.num_cached_tokens = start
            seq.status = PREFILL
            self.waiting.remove(seq)
            self.running.append(seq)
            if seq.kv_import is not None:
                step.add_kv_import(seq, computed.num_tokens // self.allocator.block_size)
                num_new = 1
            step.add(seq, num_new, slots)

    def _computed_blocks(self, seq: Sequence) -> ComputedBlocks:
        """The cached prefix ``seq`` may start from: all its tokens when a shared last block can be
        copied before its last token is recomputed, else all but the last."""
        if not self.prefix_caching or seq.params.prompt_logprobs is not None:
            return NO_COMPUTED_BLOCKS  # prompt logprobs need every prompt token's logits (as in vLLM)
        limit = seq.num_tokens if self.can_copy_blocks else seq.num_tokens - 1
        return self.allocator.get_computed_blocks(seq.token_ids(0, limit))

    def _cache_computed_blocks(self, seq: Sequence) -> None:
        """Name ``seq``'s full blocks whose K/V a completed step wrote."""
        if self.prefix_caching and seq.block_table:
            self.allocator.cache_blocks(seq.block_table, seq.num_confirmed_tokens, seq.token_ids)

    def _free(self, seq: Sequence) -> None:
        self.allocator.free(seq.block_table)
        seq.block_table_copy = None


def _running_order(seq: Sequence) -> tuple[bool, object]:
    """Decodes before prefills, each in the policy's order."""
    return (seq.status is PREFILL, seq.rank)


def _ends_with_pending(seq: Sequence, max_model_len: int) -> bool:
    """Whether the pending token is certainly ``seq``'s last (``max_tokens`` or ``max_model_len``)."""
    return (
        len(seq.output_token_ids) + seq.num_pending_tokens >= seq.params.max_tokens
        or seq.num_scheduled_tokens >= max_model_len
    )
