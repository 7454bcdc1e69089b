"""FairSharePolicy: the tenant that has been served the fewest tokens goes first.

It keeps its own state between steps, built only from the snapshots it sees: for every request the
computed-token count it saw last, and for every tenant the tokens served so far (weighted by the
tenant's share). Within a tenant, lower ``priority`` then earlier arrival goes first. Optionally a
tenant with ``max_running_per_tenant`` requests running has its other requests held back.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from hetero_core.policy import RequestView, SchedulerSnapshot, SchedulingDecision

NO_TENANT = ""


class FairShareOptions(BaseModel):
    """Settings section ``[scheduler_policy.fair-share]``."""

    model_config = ConfigDict(extra="forbid")

    weights: dict[str, float] = Field(default_factory=dict, description="tenant -> share (default 1.0)")
    max_running_per_tenant: int | None = Field(None, ge=1, description="hold back a tenant's extra requests")


class FairSharePolicy:
    name = "fair-share"

    def __init__(self, options: FairShareOptions | None = None) -> None:
        self.options = options or FairShareOptions()
        self.served: dict[str, float] = {}  # tenant -> weighted tokens computed for it
        self.last_computed: dict[str, int] = {}  # request id -> computed tokens at the last snapshot

    def decide(self, snapshot: SchedulerSnapshot) -> SchedulingDecision:
        self._account(snapshot.running)
        ranked = sorted(snapshot.requests, key=self._key)
        return SchedulingDecision(
            order=tuple(r.request_id for r in ranked), hold_back=self._held(snapshot, ranked)
        )

    def _key(self, request: RequestView):
        tenant = request.tenant or NO_TENANT
        return (self.served.get(tenant, 0.0), tenant, request.priority, request.arrival_order)

    def _account(self, running: tuple[RequestView, ...]) -> None:
        seen = {}
        for request in running:
            tenant = request.tenant or NO_TENANT
            new_tokens = request.num_computed_tokens - self.last_computed.get(request.request_id, 0)
            weight = self.options.weights.get(tenant, 1.0)
            self.served[tenant] = self.served.get(tenant, 0.0) + max(new_tokens, 0) / weight
            seen[request.request_id] = request.num_computed_tokens
        self.last_computed = seen  # finished and preempted requests drop out

    def _held(self, snapshot: SchedulerSnapshot, ranked: list[RequestView]) -> frozenset[str]:
        """With a cap, each tenant may admit only as many requests as it has free running places."""
        limit = self.options.max_running_per_tenant
        if limit is None:
            return frozenset()
        places: dict[str, int] = {}
        for request in snapshot.running:
            tenant = request.tenant or NO_TENANT
            places[tenant] = places.get(tenant, limit) - 1
        held = []
        for request in ranked:
            if request.state in ("waiting", "swapped"):
                tenant = request.tenant or NO_TENANT
                places[tenant] = places.get(tenant, limit) - 1
                if places[tenant] < 0:
                    held.append(request.request_id)
        return frozenset(held)
