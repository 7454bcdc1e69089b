"""The front end's GET /metrics: requests per role as the front end saw them, lost ones, and the split
of the last requests' time to first token (prefill, KV transfer). Each role's engine keeps its own
gauges."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class DisaggregatedMetrics:
    """Stands in for ``EngineMetrics`` in ``create_app``: a registry, and ``watch`` for the client."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

    def watch(self, client) -> None:
        self.registry.register(_Collector(client))


class _Collector:
    def __init__(self, client) -> None:
        self.client = client

    def collect(self):
        c = self.client
        for name, doc, counts in (
            ("hetero_role_requests", "Requests a role started", c.num_started),
            ("hetero_role_requests_lost", "Requests lost because their role failed", c.num_lost),
        ):
            family = CounterMetricFamily(name, doc, labels=["role"])
            for role in ("prefill", "decode"):
                family.add_metric([role], counts[role])
            yield family
        timings = c.timings[-100:]
        for key in ("prefill_s", "transfer_s"):
            values = [t[key] for t in timings if key in t]
            yield GaugeMetricFamily(
                f"hetero_disagg_mean_{key[:-2]}_seconds",
                f"Mean {key[:-2]} seconds of the last {len(values)} requests",
                value=sum(values) / len(values) if values else 0.0,
            )
        yield GaugeMetricFamily(
            "hetero_disagg_roles_up", "Roles answering /health (of 2)", value=2 - len(c._down)
        )
