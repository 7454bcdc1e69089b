"""GET /metrics: Prometheus text format. Counters and histograms are fed by the engine loop thread."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from hetero_core.async_llm import AsyncLLM

router = APIRouter()
disable_created_metrics()  # no *_created samples: they double the output and nobody graphs them
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class EngineMetrics:
    """The AsyncLLM observer: one registry per server, so servers in one process stay apart."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.prompt_tokens = Counter(
            "hetero_prompt_tokens", "Prompt tokens of requests that started generating", registry=r
        )
        self.generation_tokens = Counter("hetero_generation_tokens", "Generated tokens", registry=r)
        self.finished = Counter(
            "hetero_requests_finished", "Finished requests by reason", ["finish_reason"], registry=r
        )
        self.failed = Counter("hetero_requests_failed", "Requests the engine failed", registry=r)
        self.preemptions = Counter("hetero_preemptions", "Preemptions of finished requests", registry=r)
        self.ttft = Histogram(
            "hetero_time_to_first_token_seconds",
            "Arrival to first token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "hetero_inter_token_latency_seconds",
            "Between consecutive tokens of a request",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "hetero_e2e_request_latency_seconds", "Arrival to finish", buckets=LATENCY_BUCKETS, registry=r
        )
        self.batch_size = Histogram(
            "hetero_step_batch_size",
            "Sequences carried by one engine step",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self._last_token_time: dict[str, float] = {}

    def watch(self, llm: AsyncLLM) -> None:
        """Report the engine's gauges (running, waiting, KV blocks...) at every scrape."""
        self.registry.register(_StatsCollector(llm))

    # -- observer hooks (engine loop thread) -----------------------------------------------------
    def on_step(self, batch_size: int) -> None:
        self.batch_size.observe(batch_size)

    def on_output(self, out, num_new_tokens: int) -> None:
        now = time.time()
        if num_new_tokens > 0:
            self.generation_tokens.inc(num_new_tokens)
            previous = self._last_token_time.get(out.request_id)
            if previous is None:
                self.prompt_tokens.inc(len(out.prompt_token_ids))
                if out.first_token_time is not None:
                    self.ttft.observe(max(0.0, out.first_token_time - out.arrival_time))
            else:
                for _ in range(num_new_tokens):
                    self.itl.observe(max(0.0, (now - previous) / num_new_tokens))
            self._last_token_time[out.request_id] = now
        if out.finished or out.error is not None:
            self._last_token_time.pop(out.request_id, None)
            if out.error is not None:
                self.failed.inc()
                return
            self.finished.labels(out.finish_reason or "unknown").inc()
            self.preemptions.inc(out.num_preemptions)
            self.e2e.observe(max(0.0, (out.finish_time or now) - out.arrival_time))


class _StatsCollector:
    def __init__(self, llm: AsyncLLM) -> None:
        self.llm = llm

    def collect(self):
        s = self.llm.stats
        gauges = {
            "hetero_requests_running": ("Sequences running in the engine", s.num_running),
            "hetero_requests_waiting": ("Sequences waiting for admission", s.num_waiting),
            "hetero_requests_swapped": ("Sequences swapped out", s.num_swapped),
            "hetero_requests_pending": ("Requests accepted and not finished", s.num_pending),
            "hetero_queued_tokens": (
                "Prompt + remaining output tokens of unfinished requests",
                s.num_queued_tokens,
            ),
            "hetero_kv_blocks_used": ("KV cache blocks in use", s.num_blocks - s.num_free_blocks),
            "hetero_kv_blocks_total": ("KV cache blocks in the pool", s.num_blocks),
            "hetero_engine_steps": ("Engine steps that ran a batch", s.num_steps),
            "hetero_step_batch_size_max": ("Most sequences one step carried", s.max_step_batch_size),
        }
        if s.prefix_cache_hit_rate is not None:
            gauges["hetero_prefix_cache_hit_rate"] = ("Prefix cache hits / lookups", s.prefix_cache_hit_rate)
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
        counters = {  # speculative decoding (vLLM's names): acceptance rate = accepted / draft tokens,
            # mean accepted length = 1 + accepted / drafts
            "hetero_spec_decode_num_drafts": (
                "Sequence-steps that verified proposed tokens",
                s.spec_num_drafts,
            ),
            "hetero_spec_decode_num_draft_tokens": (
                "Proposed tokens verified by the target",
                s.spec_num_draft_tokens,
            ),
            "hetero_spec_decode_num_accepted_tokens": (
                "Proposed tokens the target kept",
                s.spec_num_accepted_tokens,
            ),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=value)


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
            "description": "Prometheus text format",
        }
    },
)
async def metrics(request: Request) -> Response:
    registry = request.app.state.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
