"""PolicyRunner: builds the snapshot a policy sees, asks it, validates and applies its decision.

A policy that raises or returns an invalid decision does not stop the engine: the problem is logged
with the policy's name (once; later ones are counted) and that step runs in arrival order. If nothing
runs and the policy holds every request back for ``MAX_STEPS_HELD_BACK`` steps in a row, its hold-backs
are ignored for a step, with a warning naming it: a policy can delay requests, never stall the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetero_core.engine.policy import (
    MAX_STEPS_HELD_BACK,
    RequestView,
    SchedulerSnapshot,
    SchedulingDecision,
    decision_problems,
)
from hetero_core.engine.sequence import Sequence, SequenceStatus
from hetero_core.errors import ConfigError
from hetero_core.logging import get_logger

log = get_logger("hetero.scheduler")
_STATE = {
    SequenceStatus.PENDING: "waiting",
    SequenceStatus.PREFILL: "prefill",
    SequenceStatus.DECODE: "decode",
    SequenceStatus.SWAPPED: "swapped",
}


@dataclass(frozen=True)
class Plan:
    """A validated decision, ready for the scheduler: ``rank`` by request id (lower first)."""

    rank: dict[str, int]
    hold_back: frozenset[str]
    preempt: tuple[str, ...]


def view_of(seq: Sequence) -> RequestView:
    return RequestView(
        request_id=seq.request_id,
        arrival_order=seq.seq_id,
        arrival_time=seq.arrival_time,
        priority=seq.priority,
        tenant=seq.tenant,
        state=_STATE.get(seq.status, seq.status.value),
        num_prompt_tokens=len(seq.prompt_token_ids),
        num_computed_tokens=seq.num_computed_tokens,
        num_output_tokens=len(seq.output_token_ids),
        num_cached_prefix_tokens=seq.num_cached_tokens,
        max_tokens=seq.params.max_tokens,
        num_preemptions=seq.num_preemptions,
    )


class PolicyRunner:
    def __init__(self, policy, name: str) -> None:
        if not callable(getattr(policy, "decide", None)):
            raise ConfigError(
                f"scheduler policy '{name}' returned {type(policy).__name__}, which has no "
                "decide(snapshot) method; subclass hetero_core.engine.policy.SortKeyPolicy (one key()) "
                "or implement decide() returning a SchedulingDecision"
            )
        self.policy = policy
        self.name = name
        self.num_invalid_decisions = 0
        self.num_hold_back_overrides = 0
        self.num_idle_steps = 0  # consecutive steps with nothing running and every request held back

    def plan(self, snapshot: SchedulerSnapshot, pending: list[Sequence]) -> Plan:
        """Ask the policy; ``pending`` are the waiting and swapped sequences (hold-back counts)."""
        try:
            decision = self.policy.decide(snapshot)
            problems = decision_problems(snapshot, decision)
        except Exception as exc:  # a plugin bug must not stop the engine
            problems = [f"decide() raised {type(exc).__name__}: {exc}"]
        if problems:
            self._report(problems)
            decision = SchedulingDecision(order=tuple(r.request_id for r in sorted(
                snapshot.requests, key=lambda r: r.arrival_order)))
        hold_back = frozenset(decision.hold_back)
        idle = not snapshot.running and pending and all(s.request_id in hold_back for s in pending)
        self.num_idle_steps = self.num_idle_steps + 1 if idle else 0
        if self.num_idle_steps > MAX_STEPS_HELD_BACK:
            self.num_hold_back_overrides += 1
            log.warning("policy.hold_back_overridden", policy=self.name, num_idle_steps=self.num_idle_steps - 1,
                        request_ids=[s.request_id for s in pending][:5],
                        reason="nothing runs and the policy holds every request back")
            hold_back = frozenset()
        rank = {request_id: i for i, request_id in enumerate(decision.order)}
        return Plan(rank, hold_back, tuple(decision.preempt))

    def _report(self, problems: list[str]) -> None:
        self.num_invalid_decisions += 1
        if self.num_invalid_decisions == 1:
            log.warning("policy.invalid_decision", policy=self.name, problems="; ".join(problems),
                        fallback="arrival order for this step; later invalid decisions are only counted")
