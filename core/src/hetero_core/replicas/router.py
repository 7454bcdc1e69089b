"""FewestQueuedTokensRouter: a Ray Serve request router that sends each request to the engine replica
holding the fewest queued tokens (``ledger.py`` does the counting).

For each request it ranks every replica, each in a rank of its own, best first, and charges the
request's estimated tokens to the first; Ray Serve sends the request to the first replica that accepts
it (one at ``max_ongoing_requests`` refuses, and the next in rank is tried), and ``on_request_routed``
moves the charge there. Charging at choice time matters for bursts: 64 requests arriving together are
ranked one after another, each seeing the ones before it. The request's size comes from the keyword
arguments the frontend passes to ``EngineReplica.generate`` (``prompt``, ``params``).
"""

from __future__ import annotations

import time

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from hetero_core.replicas.ledger import QueuedTokensLedger, estimate_request_tokens


class FewestQueuedTokensRouter(RequestRouter):
    def initialize_state(self, **kwargs) -> None:
        self.ledger = QueuedTokensLedger()

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id: r for r in candidate_replicas}
        for replica_id, replica in by_id.items():
            self.ledger.report(replica_id, replica.routing_stats)
        ranked = self.ledger.rank(list(by_id))
        if ranked and pending_request is not None:
            self._charge(pending_request, ranked[0])
        return [[by_id[replica_id]] for replica_id in ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        self._charge(pending_request, replica_id)

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        self.ledger.record_finished(replica_id, internal_request_id)

    def on_replica_actor_died(self, replica_id) -> None:
        super().on_replica_actor_died(replica_id)
        self.ledger.forget(replica_id)

    def _charge(self, pending_request: PendingRequest, replica_id) -> None:
        kwargs = pending_request.kwargs or {}
        num_tokens = estimate_request_tokens(
            kwargs.get("prompt"), getattr(kwargs.get("params"), "max_tokens", None)
        )
        self.ledger.record_sent(
            replica_id, pending_request.metadata.internal_request_id, num_tokens, time.time()
        )
