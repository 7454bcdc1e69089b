"""AsyncLLM without the server: one loop thread, callers from tasks and threads, aborts, failures."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from hetero_core.async_llm import (
    AsyncLLM,
    EngineDeadError,
    EngineOverloadedError,
    RequestFailedError,
)
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.errors import InvalidRequestError

SLOW = {"decode_latency_per_step": 0.002}


def wait_idle(llm, timeout_s=30.0) -> bool:
    """Stats are published after each loop pass: wait (bounded) until no request holds a block."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = llm.stats
        if s.num_pending == 0 and s.num_running == 0 and s.num_free_blocks == s.num_blocks:
            return True
        time.sleep(0.005)
    return False


async def run_one(llm, prompt, params, **kwargs):
    deltas = [d async for d in llm.generate(prompt, params, **kwargs)]
    return deltas


def test_concurrent_requests_share_steps_and_match_offline_output(make_mock_engine):
    prompts = [f"prompt number {i}" for i in range(12)]
    params = SamplingParams(max_tokens=20, seed=7)
    expected = [o.text for o in make_mock_engine(SLOW).generate(prompts, params)]
    with AsyncLLM(make_mock_engine(SLOW)) as llm:

        async def main():
            return await asyncio.gather(*(run_one(llm, p, params) for p in prompts))

        results = asyncio.run(main())
        assert ["".join(d.text for d in deltas) for deltas in results] == expected
        assert all(
            deltas[-1].finished and deltas[-1].output.text == text for deltas, text in zip(results, expected)
        )
        assert all(sum(len(d.token_ids) for d in deltas) == 20 for deltas in results)
        assert llm.stats.max_step_batch_size > 1  # requests that arrived together joined a batch


def test_requests_from_many_threads_each_with_its_own_event_loop(make_mock_engine):
    params = SamplingParams(max_tokens=15, seed=1)
    prompts = [f"thread {i}" for i in range(8)]
    expected = dict(zip(prompts, (o.text for o in make_mock_engine().generate(prompts, params))))
    results, errors = {}, []
    with AsyncLLM(make_mock_engine(SLOW)) as llm:

        def worker(prompt):
            try:
                deltas = asyncio.run(run_one(llm, prompt, params))
                results[prompt] = "".join(d.text for d in deltas)
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert errors == [] and results == expected


def test_closing_the_iterator_aborts_and_frees_blocks(make_mock_engine):
    with AsyncLLM(make_mock_engine(SLOW)) as llm:

        async def main():
            stream = llm.generate("abandon me", SamplingParams(max_tokens=1000))
            async for _ in stream:
                break
            await stream.aclose()

        asyncio.run(main())
        assert wait_idle(llm)


def test_invalid_and_unfittable_requests_fail_alone(make_mock_engine):
    with AsyncLLM(make_mock_engine(max_model_len=32)) as llm:

        async def main():
            return await asyncio.gather(
                run_one(llm, "", SamplingParams(max_tokens=2)),
                run_one(llm, "x" * 40, SamplingParams(max_tokens=2)),
                run_one(llm, "fine", SamplingParams(max_tokens=2)),
                return_exceptions=True,
            )

        empty, too_long, fine = asyncio.run(main())
    assert isinstance(empty, InvalidRequestError) and "empty" in str(empty)
    # The engine refuses at once what it can never run, so AsyncLLM raises before any step.
    assert isinstance(too_long, InvalidRequestError) and "max_model_len" in str(too_long)
    assert fine[-1].output.num_preemptions == 0 and len(fine[-1].output.output_token_ids) == 2


class FailingOnce:
    """An executor wrapper that raises on the step it is armed for."""

    def __init__(self, inner):
        self.inner, self.armed = inner, False
        self.capabilities = inner.capabilities

    def execute(self, batch):
        if self.armed:
            self.armed = False
            raise RuntimeError("device fell over")
        return self.inner.execute(batch)

    def shutdown(self):
        self.inner.shutdown()


def test_a_failing_step_fails_its_requests_and_the_loop_keeps_serving(make_mock_engine):
    engine = make_mock_engine(SLOW)
    failing = engine.executor = FailingOnce(engine.executor)
    with AsyncLLM(engine) as llm:

        async def main():
            stream = llm.generate("victim", SamplingParams(max_tokens=50))
            await anext(stream)
            failing.armed = True
            # The engine fails the requests of a step whose executor raised, and goes on.
            with pytest.raises(RequestFailedError, match="device fell over"):
                async for _ in stream:
                    pass
            return await run_one(llm, "survivor", SamplingParams(max_tokens=5, seed=3))

        deltas = asyncio.run(main())
        assert deltas[-1].finished and len(deltas[-1].output.output_token_ids) == 5
        assert llm.is_running
        assert wait_idle(llm)


def test_beyond_max_pending_requests_is_refused(make_mock_engine):
    with AsyncLLM(make_mock_engine({"decode_latency_per_step": 0.01}), max_pending_requests=2) as llm:

        async def main():
            streams = [llm.generate(f"r{i}", SamplingParams(max_tokens=30)) for i in range(3)]
            await anext(streams[0])
            await anext(streams[1])
            with pytest.raises(EngineOverloadedError, match="max_pending_requests"):
                await anext(streams[2])
            for s in streams[:2]:
                await s.aclose()

        asyncio.run(main())


def test_shutdown_fails_pending_requests_and_refuses_new_ones(make_mock_engine):
    llm = AsyncLLM(make_mock_engine({"decode_latency_per_step": 0.01}))

    async def main():
        stream = llm.generate("long", SamplingParams(max_tokens=2000))
        await anext(stream)
        await asyncio.get_running_loop().run_in_executor(None, llm.shutdown)
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError):
            await anext(llm.generate("late", SamplingParams(max_tokens=1)))

    asyncio.run(main())
    assert not llm.is_running


def test_priority_and_tenant_reach_an_engine_that_takes_them(make_mock_engine):
    engine = make_mock_engine()
    seen = []
    original = engine.add_request

    def add_request(request, params=None, request_id=None, **kwargs):  # AsyncLLM adds EngineRequests
        seen.append((request.priority, request.tenant))
        return original(request, params, request_id, **kwargs)

    engine.add_request = add_request
    with AsyncLLM(engine) as llm:
        asyncio.run(run_one(llm, "p", SamplingParams(max_tokens=1), priority=-2, tenant="acme"))
    assert seen == [(-2, "acme")]


def test_stats_report_the_engines_prefix_cache_hit_rate(make_mock_engine):
    shared = "a system prompt that fills more than two KV blocks of sixteen tokens each. "
    with AsyncLLM(make_mock_engine()) as llm:
        assert llm.stats.prefix_cache_hit_rate is None  # nothing looked up yet
        asyncio.run(run_one(llm, shared + "first", SamplingParams(max_tokens=2)))
        asyncio.run(run_one(llm, shared + "second", SamplingParams(max_tokens=2)))
        assert wait_idle(llm)
        assert 0 < llm.stats.prefix_cache_hit_rate == llm.engine.stats().prefix_cache_hit_rate
