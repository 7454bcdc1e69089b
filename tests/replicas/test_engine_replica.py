"""EngineReplica in-process (no Ray instance): what Ray Serve calls on it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from hetero_core.async_llm import EngineDeadError
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.settings import load_settings

serve = pytest.importorskip("ray.serve", reason="replicas need Ray Serve: pip install 'hetero-core[ray]'")


@pytest.fixture
def replica(monkeypatch):
    from hetero_core.replicas import engine_replica

    context = SimpleNamespace(replica_id=SimpleNamespace(unique_id="r1"))
    monkeypatch.setattr(engine_replica.serve, "get_replica_context", lambda: context)
    replica = engine_replica.EngineReplica(load_settings(executor="mock"), max_pending_requests=8)
    yield replica
    replica.llm.shutdown()


def test_generate_streams_the_replica_id_then_the_deltas(replica):
    async def main():
        return [
            item
            async for item in replica.generate(
                prompt="hi", params=SamplingParams(max_tokens=3), request_id="req"
            )
        ]

    items = asyncio.run(main())
    assert items[0] == "r1" and items[-1].finished
    assert sum(len(d.token_ids) for d in items[1:]) == 3


def test_routing_stats_report_queued_tokens_and_health_fails_once_the_engine_stops(replica):
    stats = replica.record_routing_stats()
    assert stats["num_queued_tokens"] == 0 and stats["reported_at"] > 0
    assert replica.engine_info().max_model_len == replica.llm.engine.max_model_len
    replica.check_health()  # a running engine: no exception
    replica.llm.shutdown()
    with pytest.raises(EngineDeadError, match="the engine of replica r1 stopped"):
        replica.check_health()


def test_queued_tokens_count_prompt_and_remaining_output(make_mock_engine):
    engine = make_mock_engine()
    engine.add_request([40] * 10, SamplingParams(max_tokens=20, ignore_eos=True), "a")
    engine.add_request([41] * 50, SamplingParams(max_tokens=30, ignore_eos=True), "b")
    assert engine.stats().num_queued_tokens == (10 + 20) + (50 + 30)
    engine.step()  # prefill both, one token each
    assert engine.stats().num_queued_tokens == (10 + 19) + (50 + 29)
    engine.abort("b")
    assert engine.stats().num_queued_tokens == 10 + 19
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats().num_queued_tokens == 0
