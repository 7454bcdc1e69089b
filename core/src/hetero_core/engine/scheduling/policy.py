"""The scheduler-policy seam: a policy reads a snapshot and returns a decision.

Each step the scheduler hands the policy an immutable ``SchedulerSnapshot`` (every waiting, running
and swapped request as a frozen ``RequestView``, the pool's free / cached / total blocks and the
step's budgets) and gets back a ``SchedulingDecision``:

- ``order``: request ids, most urgent first. Running requests are served in this order (decodes
  before prefills, always), swapped ones are brought back and waiting ones admitted in this order,
  and when KV blocks run out the *last* running request in this order is preempted first.
- ``hold_back``: waiting or swapped requests not to admit this step (a fair-share policy throttling
  a tenant). When nothing runs and every request has been held back for ``MAX_STEPS_HELD_BACK``
  steps in a row, the hold-backs are ignored (with a warning naming the policy): a policy cannot
  stall the engine.
- ``preempt``: running requests to preempt now (to make room for more urgent waiting ones).

The scheduler validates the decision (``decision_problems``) and applies it; budgets, admission
limits and the KV pool stay with the scheduler, so a policy cannot break them. An invalid decision
is logged with the policy's name and the step falls back to arrival order.

The simplest policy is one sort key: subclass ``SortKeyPolicy`` and write ``key(request)``; the engine
then builds no snapshot, and asks the key once per request when the key reads only fields that
never change (``policy_keys``). A richer policy implements ``decide(snapshot)`` and may keep its own
state between steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

MAX_STEPS_HELD_BACK = 64


@dataclass(frozen=True, slots=True)
class RequestView:
    """What a policy may know about one request."""

    request_id: str
    arrival_order: int  # unique, increasing with arrival
    arrival_time: float  # time.time() at arrival
    priority: int  # lower is more urgent
    tenant: str | None
    state: str  # "waiting" | "prefill" | "decode" | "swapped"
    num_prompt_tokens: int
    num_computed_tokens: int  # tokens whose K/V are in the cache now
    num_output_tokens: int
    num_cached_prefix_tokens: int  # prompt tokens the prefix cache served (or would serve, if waiting)
    max_tokens: int
    num_preemptions: int


@dataclass(frozen=True, slots=True)
class SchedulerSnapshot:
    """The scheduler's state as a policy sees it; requests in arrival order."""

    step: int
    waiting: tuple[RequestView, ...]
    running: tuple[RequestView, ...]
    swapped: tuple[RequestView, ...]
    num_free_blocks: int
    num_cached_blocks: int
    num_total_blocks: int
    block_size: int
    max_num_batched_tokens: int  # the step's token budget
    max_batch_size: int  # sequences in one step
    max_num_seqs: int  # sequences running at once

    @property
    def requests(self) -> tuple[RequestView, ...]:
        return self.running + self.swapped + self.waiting


@dataclass(frozen=True)
class SchedulingDecision:
    order: tuple[str, ...]
    hold_back: frozenset[str] = frozenset()
    preempt: tuple[str, ...] = ()


@runtime_checkable
class SchedulerPolicy(Protocol):
    name: str

    def decide(self, snapshot: SchedulerSnapshot) -> SchedulingDecision:
        """Order, hold-backs and preemptions for this step. Deterministic for the same snapshots."""
        ...


class SortKeyPolicy:
    """A policy that is one sort key: lower keys are served and admitted first, preempted last.

    ``key(request)`` must depend on the request alone (the determinism rule of ``decide``): the
    engine asks it once per request while it reads only fields that never change (arrival,
    priority, tenant, prompt length, ``max_tokens``), and every step when it reads one that does.
    A key that reads anything else (the clock, the policy's own state) sets ``cache_keys = False``.
    """

    name = "sort-key"
    cache_keys = True

    def key(self, request: RequestView) -> Any:
        raise NotImplementedError

    def decide(self, snapshot: SchedulerSnapshot) -> SchedulingDecision:
        ranked = sorted(snapshot.requests, key=lambda r: (self.key(r), r.arrival_order))
        return SchedulingDecision(order=tuple(r.request_id for r in ranked))


def decision_problems(snapshot: SchedulerSnapshot, decision: Any) -> list[str]:
    """Why ``decision`` cannot be applied to ``snapshot`` (empty when it is valid)."""
    if not isinstance(decision, SchedulingDecision):
        return [f"decide() must return a SchedulingDecision, got {type(decision).__name__}"]
    problems = []
    known = {r.request_id for r in snapshot.requests}
    running = {r.request_id for r in snapshot.running}
    order = list(decision.order)
    if len(set(order)) != len(order):
        problems.append("order names a request more than once")
    if set(order) != known:
        missing, unknown = known - set(order), set(order) - known
        if missing:
            problems.append(f"order leaves out {sorted(missing)[:5]}")
        if unknown:
            problems.append(f"order names unknown requests {sorted(map(str, unknown))[:5]}")
    held_running = set(decision.hold_back) & running
    if held_running:
        problems.append(f"hold_back names running requests {sorted(held_running)[:5]} (preempt them instead)")
    if not set(decision.hold_back) <= known:
        problems.append("hold_back names unknown requests")
    if not set(decision.preempt) <= running:
        problems.append(
            f"preempt names requests that are not running: {sorted(set(decision.preempt) - running)[:5]}"
        )
    return problems
