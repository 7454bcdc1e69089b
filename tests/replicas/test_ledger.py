"""The router's choice, in-process: the replica with the fewest queued tokens, counting what was sent
since each replica's last report."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import pytest

from hetero_core.engine.requests.params import SamplingParams
from hetero_core.replicas.ledger import (
    QUEUED_TOKENS_KEY,
    REPORT_TIME_KEY,
    QueuedTokensLedger,
    estimate_request_tokens,
)


def stats(tokens: int, at: float) -> dict:
    return {QUEUED_TOKENS_KEY: tokens, REPORT_TIME_KEY: at}


def test_the_replica_with_the_fewest_reported_tokens_comes_first():
    ledger = QueuedTokensLedger()
    for replica, tokens in {"a": 900, "b": 40, "c": 300}.items():
        ledger.report(replica, stats(tokens, at=10.0))
    assert ledger.rank(["a", "b", "c"]) == ["b", "c", "a"]


def test_requests_sent_since_the_report_count_until_the_next_report_includes_them():
    ledger = QueuedTokensLedger()
    ledger.report("a", stats(100, at=10.0))
    ledger.report("b", stats(150, at=10.0))
    ledger.record_sent("a", "r1", 80, now=11.0)  # a: 180, b: 150
    assert ledger.rank(["a", "b"]) == ["b", "a"]
    ledger.report("a", stats(120, at=12.0))  # a's report now includes r1 (sent at 11.0)
    assert ledger.queued_tokens("a") == 120 and ledger.rank(["a", "b"]) == ["a", "b"]
    ledger.record_sent("b", "r2", 10, now=13.0)
    ledger.report("b", stats(150, at=12.5))  # an older report than r2: r2 still counts
    assert ledger.queued_tokens("b") == 160


def test_a_request_finishing_after_a_report_counted_it_is_taken_off_that_report():
    ledger = QueuedTokensLedger()
    ledger.record_sent("a", "r1", 96, now=10.0)
    ledger.record_sent("a", "r2", 96, now=11.95)  # just before the report: maybe not in it yet
    report = stats(200, at=12.0)  # counts r1 and some other work
    ledger.report("a", report)
    assert ledger.queued_tokens("a") == 200 + 96
    ledger.record_finished("a", "r1")
    assert ledger.queued_tokens("a") == 104 + 96
    ledger.report("a", report)  # the router sees the same report again at its next choice: no change
    assert ledger.queued_tokens("a") == 104 + 96
    ledger.record_finished("a", "r2")
    ledger.report("a", stats(50, at=13.0))
    ledger.record_sent("a", "r3", 400, now=14.0)
    ledger.report("a", stats(60, at=15.0))
    ledger.record_finished("a", "r3")  # an estimate larger than the report: not below zero
    assert ledger.queued_tokens("a") == 0


def test_a_burst_spreads_over_replicas_and_finished_or_moved_requests_stop_counting():
    ledger = QueuedTokensLedger()
    chosen = []
    for i in range(8):  # equal requests arriving together, no report yet
        replica = ledger.rank(["a", "b"])[0]
        ledger.record_sent(replica, f"r{i}", 50, now=1.0)
        chosen.append(replica)
    assert chosen.count("a") == chosen.count("b") == 4
    first, other = chosen[0], "b" if chosen[0] == "a" else "a"
    ledger.record_sent(other, "r0", 50, now=1.0)  # refused by its first choice, sent to the other
    assert (ledger.queued_tokens(first), ledger.queued_tokens(other)) == (150, 250)
    ledger.record_finished(first, "r0")  # a finish reported by a replica that no longer holds it: ignored
    assert ledger.queued_tokens(other) == 250
    ledger.record_finished(other, "r0")
    assert ledger.queued_tokens("a") + ledger.queued_tokens("b") == 350
    ledger.forget("a")
    assert ledger.queued_tokens("a") == 0 and ledger.rank(["a", "b"])[0] == "a"


def test_ties_are_broken_at_random_and_reports_without_the_key_are_ignored():
    ledger = QueuedTokensLedger()
    ledger.report("a", {})
    ledger.report("b", None)
    firsts = {ledger.rank(["a", "b"], random.Random(seed))[0] for seed in range(20)}
    assert firsts == {"a", "b"}


def test_request_size_estimates():
    assert estimate_request_tokens([5, 6, 7], 10) == 13  # token ids: exact
    assert estimate_request_tokens("x" * 40, 16) == 10 + 16  # text: four characters per token
    assert estimate_request_tokens([{"role": "user", "content": "y" * 8}], None) == 2
    assert estimate_request_tokens(None, None) == 1  # a call without a prompt (engine_info)


def test_the_ray_serve_router_ranks_with_the_ledger():
    pytest.importorskip(
        "ray.serve", reason="the router is a Ray Serve class (pip install 'hetero-core[ray]')"
    )
    from ray.serve._private.common import DeploymentHandleSource, DeploymentID

    from hetero_core.replicas.router import FewestQueuedTokensRouter

    async def main():
        router = FewestQueuedTokensRouter(
            deployment_id=DeploymentID(name="EngineReplica", app_name="test"),
            handle_source=DeploymentHandleSource.UNKNOWN,
        )
        router.initialize_state()
        busy = SimpleNamespace(replica_id="busy", routing_stats=stats(500, at=1.0))
        idle = SimpleNamespace(replica_id="idle", routing_stats=stats(20, at=1.0))
        request = SimpleNamespace(
            kwargs={"prompt": [1] * 100, "params": SamplingParams(max_tokens=400)},
            metadata=SimpleNamespace(internal_request_id="req-1"),
        )
        first = await router.choose_replicas([busy, idle], request)
        second = await router.choose_replicas([busy, idle], None)  # the idle one now holds req-1 (520)
        router.on_request_completed("idle", "req-1")
        third = await router.choose_replicas([busy, idle], None)
        return first, second, third

    first, second, third = asyncio.run(main())
    assert [[r.replica_id for r in rank] for rank in first] == [["idle"], ["busy"]]
    assert second[0][0].replica_id == "busy" and third[0][0].replica_id == "idle"
