"""Async scheduling (the next step planned while the executor runs this one, on its own thread) gives
the same tokens, texts and finish reasons as the plain engine, over preemption (recompute and swap),
chunked prefill, prefix-cache hits, stop strings, stop ids, EOS and aborts; and every token the
executor is given at a position is the token the request has there (the sampled token written into
the next step's batch, never a placeholder)."""

from __future__ import annotations

import pytest

from hetero_core.engine.requests.params import SamplingParams
from hetero_core.engine.scheduling.batch_builder import PLACEHOLDER

SYSTEM = [40 + (i * 7) % 60 for i in range(24)]  # a shared prefix of 24 tokens
PROMPTS = [SYSTEM + [50 + i, 60 + i, 70 + i] * (1 + i % 4) for i in range(10)] + [
    [33 + i] * (5 + 9 * i) for i in range(4)
]
PARAMS = [
    SamplingParams(max_tokens=24, ignore_eos=True),
    SamplingParams(max_tokens=30, stop=["a", "Q"]),  # stop strings: the step after a stop is reconciled
    SamplingParams(max_tokens=16, stop_token_ids=list(range(90, 100))),
    SamplingParams(max_tokens=40, seed=7, stop=["zz"], include_stop_str_in_output=True),
    SamplingParams(max_tokens=1),
    SamplingParams(max_tokens=9),  # EOS after the mock's eos_after
]
SCENARIOS = {
    "plain": dict(),
    "recompute": dict(max_num_blocks=40, memory_threshold=1.0, preemption_mode="recompute"),
    "swap": dict(max_num_blocks=40, memory_threshold=1.0, preemption_mode="swap", num_swap_blocks=128),
    "chunked": dict(max_prefill_chunk=7, max_total_tokens=40),
    "no prefix cache": dict(enable_prefix_caching=False, max_batch_size=3),
}


class TokenChecker:
    """Wraps the executor; keeps (seq id, position) -> token of every token it was given."""

    def __init__(self, inner):
        self.inner, self.seen = inner, {}

    def execute(self, batch):
        for i in range(batch.num_seqs):
            start, end = batch.query_start_loc[i], batch.query_start_loc[i + 1]
            for position, token in zip(batch.positions[start:end], batch.token_ids[start:end]):
                assert token != PLACEHOLDER, f"sequence {batch.seq_ids[i]} position {position}: placeholder"
                self.seen[batch.seq_ids[i], position] = token
        return self.inner.execute(batch)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def run(make_mock_engine, settings, async_scheduling, aborts=()):
    """Stream every request to its end, the second half added after 3 steps (their shared prefix is
    cached by then); abort ``aborts`` (request indices) after their 3rd token."""
    engine = make_mock_engine({"eos_after": 8}, async_scheduling=async_scheduling, block_size=4, **settings)
    checker = engine.executor = TokenChecker(engine.executor)
    ids = [engine.add_request(p, PARAMS[i % len(PARAMS)]) for i, p in enumerate(PROMPTS[:6])]
    finals, num_calls = {}, 0
    while engine.has_unfinished_requests():
        num_calls += 1
        if num_calls == 4:
            ids += [engine.add_request(p, PARAMS[(6 + i) % len(PARAMS)]) for i, p in enumerate(PROMPTS[6:])]
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
            elif ids.index(out.request_id) in aborts and len(out.output_token_ids) >= 3:
                assert engine.abort(out.request_id)
    prompts = dict(zip(ids, PROMPTS))
    for rid, out in finals.items():  # the tokens the executor read are the request's own
        tokens = prompts[rid] + out.output_token_ids
        for position, token in enumerate(tokens[:-1]):
            seen = checker.seen.get((int(rid), position))  # automatic request ids are the sequence ids
            assert seen in (None, token), (
                f"request {rid} position {position}: executor got {seen}, not {token}"
            )
    stats = engine.stats()
    allocator = engine.scheduler.allocator
    assert allocator.num_free_blocks == allocator.num_blocks and not engine.state.seqs
    engine.shutdown()
    return [finals[rid] for rid in ids], stats


def summary(out):
    return out.output_token_ids, out.text, out.finish_reason, out.error


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_async_scheduling_gives_the_same_outputs(make_mock_engine, name):
    reference, ref_stats = run(make_mock_engine, SCENARIOS[name], async_scheduling=False)
    got, stats = run(make_mock_engine, SCENARIOS[name], async_scheduling=True)
    assert [summary(o) for o in got] == [summary(o) for o in reference]
    assert {o.finish_reason for o in reference} >= {"length", "stop", "eos"}
    if name in ("recompute", "swap"):
        assert ref_stats.num_preemptions > 0 and stats.num_preemptions > 0
    if name == "plain":
        assert stats.prefix_cache_hit_tokens > 0


@pytest.mark.parametrize("name", ["plain", "recompute", "swap"])
def test_aborts_under_async_scheduling_end_only_the_aborted_requests(make_mock_engine, name):
    aborted = {1, 4, 6}
    reference, _ = run(make_mock_engine, SCENARIOS[name], async_scheduling=False)
    got, _ = run(make_mock_engine, SCENARIOS[name], async_scheduling=True, aborts=aborted)
    for i, (out, ref) in enumerate(zip(got, reference)):
        if i in aborted and out.finish_reason == "abort":
            assert ref.output_token_ids[: len(out.output_token_ids)] == out.output_token_ids
        else:
            assert summary(out) == summary(ref), i


def test_generate_is_the_same_with_and_without_async_scheduling(make_mock_engine):
    params = [PARAMS[i % len(PARAMS)] for i in range(len(PROMPTS))]
    plain = make_mock_engine(async_scheduling=False, max_num_blocks=40).generate(PROMPTS, params)
    engine = make_mock_engine(async_scheduling=True, max_num_blocks=40)
    overlapped = engine.generate(PROMPTS, params)
    assert [summary(o) for o in overlapped] == [summary(o) for o in plain]
    assert engine.driver.executor_thread is not None  # the setting did something: steps ran on the thread
    engine.shutdown()


def test_a_failing_step_fails_its_requests_and_the_next_step_runs_without_them(make_mock_engine):
    engine = make_mock_engine(async_scheduling=True)
    inner, calls = engine.executor, []

    class FailsSecond:
        def execute(self, batch):
            calls.append(batch.seq_ids)
            if len(calls) == 2:
                raise RuntimeError("device lost")
            return inner.execute(batch)

        def __getattr__(self, name):
            return getattr(inner, name)

    engine.executor = FailsSecond()
    first = engine.add_request("hello", SamplingParams(max_tokens=6))
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    assert "device lost" in finals[first].error
    later = engine.generate(["again"], SamplingParams(max_tokens=3))[0]
    assert later.finish_reason == "length" and len(later.output_token_ids) == 3
    engine.shutdown()
