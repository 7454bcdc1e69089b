"""The frontend's GET /metrics: requests per replica, as the frontend saw them. Each replica's engine
gauges and histograms stay in that replica (see docs/scaling.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class ReplicaMetrics:
    """Stands in for ``EngineMetrics`` in ``create_app``: a registry, and ``watch`` for the client."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

    def watch(self, client) -> None:
        self.registry.register(_ReplicaCollector(client))


class _ReplicaCollector:
    def __init__(self, client) -> None:
        self.client = client

    def collect(self):
        c = self.client
        families = [
            (
                CounterMetricFamily,
                "hetero_replica_requests",
                "Engine requests a replica started",
                c.num_started,
            ),
            (
                CounterMetricFamily,
                "hetero_replica_requests_lost",
                "Engine requests lost because their replica stopped",
                c.num_lost,
            ),
            (
                GaugeMetricFamily,
                "hetero_replica_requests_running",
                "Engine requests in flight on a replica",
                c.num_running,
            ),
        ]
        for kind, name, doc, counts in families:
            family = kind(name, doc, labels=["replica"])
            for replica in sorted(c.num_started):
                family.add_metric([replica], counts[replica])
            yield family
