"""PolicyRunner: asks the policy for the step's order, validates and applies its decision.

Each step it ranks every queued sequence (``seq.rank``, lower first) and returns the hold-backs and
preemptions. A policy that raises or returns an invalid decision does not stop the engine: the
problem is logged with the policy's name (once; later ones are counted) and that step runs in
arrival order. If nothing runs and the policy holds every request back for ``MAX_STEPS_HELD_BACK``
steps in a row, its hold-backs are ignored for a step, with a warning naming it: a policy can delay
requests, never stall the engine.

A policy that is a sort key alone (a ``SortKeyPolicy`` that does not override ``decide``) gets no
snapshot: its ``key`` is asked per request (``policy_keys``), and a key that reads only fields
that never change is asked once per request, not every step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter

from hetero_core.engine.requests.sequence import Sequence
from hetero_core.engine.scheduling.policy import (
    MAX_STEPS_HELD_BACK,
    SchedulerSnapshot,
    SchedulingDecision,
    SortKeyPolicy,
    decision_problems,
)
from hetero_core.engine.scheduling.policy_keys import SortKeys
from hetero_core.errors import ConfigError
from hetero_core.logging import get_logger

__all__ = ["Plan", "PolicyRunner"]
log = get_logger("hetero.scheduler")
_by_arrival = attrgetter("seq_id")


@dataclass(frozen=True)
class Plan:
    """A validated decision, ready for the scheduler (which reads each sequence's ``rank``)."""

    hold_back: frozenset[str]
    preempt: tuple[str, ...]


NO_CHANGES = Plan(frozenset(), ())


class PolicyRunner:
    def __init__(self, policy, name: str) -> None:
        self.name = name
        self.policy = policy
        self.num_invalid_decisions = 0
        self.num_hold_back_overrides = 0
        self.num_idle_steps = 0  # consecutive steps with nothing running and every request held back

    @property
    def policy(self):
        return self._policy

    @policy.setter
    def policy(self, policy) -> None:
        if not callable(getattr(policy, "decide", None)):
            raise ConfigError(
                f"scheduler policy '{self.name}' returned {type(policy).__name__}, which has no "
                "decide(snapshot) method; subclass hetero_core.engine.scheduling.policy.SortKeyPolicy "
                "(one key()) "
                "or implement decide() returning a SchedulingDecision"
            )
        self._policy = policy
        is_sort_key = isinstance(policy, SortKeyPolicy) and type(policy).decide is SortKeyPolicy.decide
        self._sort_keys = SortKeys(policy) if is_sort_key else None

    def plan(
        self,
        running: list[Sequence],
        waiting: list[Sequence],
        swapped: list[Sequence],
        snapshot: Callable[[], SchedulerSnapshot],
    ) -> Plan:
        """Rank ``running``, ``waiting`` and ``swapped`` (``seq.rank``); ``snapshot`` builds what a
        policy that decides sees (a sort key needs none)."""
        if self._sort_keys is not None:
            try:
                self._sort_keys.rank(running + swapped + waiting)
                self.num_idle_steps = 0
                return NO_CHANGES
            except Exception as exc:  # a plugin bug must not stop the engine
                problems = [f"key() raised {type(exc).__name__}: {exc}"]
        else:
            view = snapshot()
            try:
                decision = self.policy.decide(view)
                problems = decision_problems(view, decision)
            except Exception as exc:  # a plugin bug must not stop the engine
                problems = [f"decide() raised {type(exc).__name__}: {exc}"]
            if not problems:
                return self._apply(decision, running, waiting + swapped)
        self._report(problems)
        self._apply_arrival_order(running + swapped + waiting)
        self.num_idle_steps = 0
        return NO_CHANGES

    def _apply(self, decision: SchedulingDecision, running: list[Sequence], pending: list[Sequence]) -> Plan:
        rank = {request_id: i for i, request_id in enumerate(decision.order)}
        for seq in running:
            seq.rank = rank[seq.request_id]
        for seq in pending:
            seq.rank = rank[seq.request_id]
        hold_back = frozenset(decision.hold_back)
        idle = not running and pending and all(s.request_id in hold_back for s in pending)
        self.num_idle_steps = self.num_idle_steps + 1 if idle else 0
        if self.num_idle_steps > MAX_STEPS_HELD_BACK:
            self.num_hold_back_overrides += 1
            log.warning(
                "policy.hold_back_overridden",
                policy=self.name,
                num_idle_steps=self.num_idle_steps - 1,
                request_ids=[s.request_id for s in pending][:5],
                reason="nothing runs and the policy holds every request back",
            )
            hold_back = frozenset()
        return Plan(hold_back, tuple(decision.preempt))

    @staticmethod
    def _apply_arrival_order(seqs: list[Sequence]) -> None:
        for seq in seqs:
            seq.rank = seq.seq_id

    def _report(self, problems: list[str]) -> None:
        self.num_invalid_decisions += 1
        if self.num_invalid_decisions == 1:
            log.warning(
                "policy.invalid_decision",
                policy=self.name,
                problems="; ".join(problems),
                fallback="arrival order for this step; later invalid decisions are only counted",
            )
