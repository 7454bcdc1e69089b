"""Core's scheduler policies: ``fcfs`` (the default) and ``priority``, each one sort key over the
policy seam."""

from __future__ import annotations

from hetero_core.engine.scheduling.policy import (
    RequestView,
    SchedulerSnapshot,
    SchedulingDecision,
    SortKeyPolicy,
)


class FcfsPolicy(SortKeyPolicy):
    """First come, first served: the earliest request first, the newest preempted first."""

    name = "fcfs"

    def key(self, request: RequestView) -> int:
        return request.arrival_order


class PriorityPolicy(SortKeyPolicy):
    """Lowest ``priority`` value first (ties by arrival). A waiting request more urgent than a running
    one that cannot fit in the free blocks preempts the least urgent running request."""

    name = "priority"

    def key(self, request: RequestView) -> tuple[int, int]:
        return (request.priority, request.arrival_order)

    def decide(self, snapshot: SchedulerSnapshot) -> SchedulingDecision:
        decision = super().decide(snapshot)
        pending = [r for r in snapshot.waiting + snapshot.swapped]
        if not pending or not snapshot.running:
            return decision
        urgent = min(pending, key=self.key)
        victim = max(snapshot.running, key=self.key)
        needed = -(-(urgent.num_prompt_tokens + urgent.num_output_tokens) // snapshot.block_size)
        if self.key(urgent) < self.key(victim) and needed > snapshot.num_free_blocks:
            return SchedulingDecision(order=decision.order, preempt=(victim.request_id,))
        return decision
