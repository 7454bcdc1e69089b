"""Hypothesis fuzzing of AsyncLLM: many requests at once, from two threads' event loops, valid and
invalid, each read to the end, aborted by the caller, closed early, cancelled, or aborted before it
started. Invariants: every stream ends; a read-to-the-end request equals a solo run of the same
request (the mock executor is deterministic), an aborted or closed one got a prefix of it; every
slot is given back (``num_pending`` 0) and no KV block leaks. Long run: ``HETERO_FUZZ_EXAMPLES``
(docs/testing.md).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from functools import lru_cache

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from hetero_core.async_llm import AsyncLLM, EngineOverloadedError, RequestFailedError
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.errors import InvalidRequestError
from tests.fuzzing import TALLY, fuzz_settings, print_tally

HANG_GUARD_S = 60  # turns a hang into a failure; nothing here measures time
SETTINGS = {
    "max_num_blocks": 24,
    "block_size": 4,
    "max_model_len": 96,
    "max_batch_size": 4,
    "max_total_tokens": 24,
    "max_num_seqs": 6,
    "max_tokens": 8,
}
MOCK = {"eos_probability": 0.05}

PROMPTS = st.one_of(
    st.text(alphabet="abcdefgh ", min_size=1, max_size=30),
    st.text(min_size=1, max_size=10),
    st.lists(st.integers(32, 126), min_size=1, max_size=20),
    st.just([{"role": "user", "content": "hello"}]),
    st.sampled_from([None, "", [], {"prompt": "dict"}, {"text": "no"}, "x" * 200, "caf\ud800"]),
)
VALID_PARAMS = st.builds(
    SamplingParams,
    max_tokens=st.integers(1, 16),
    seed=st.sampled_from([None, 1]),
    ignore_eos=st.booleans(),
    stop=st.sampled_from([None, "a"]),
)
PARAMS = st.one_of(
    st.none(),
    VALID_PARAMS,
    VALID_PARAMS,
    st.fixed_dictionaries({"max_tokens": st.integers(1, 16)}, optional={"ignore_eos": st.booleans()}),
    st.sampled_from([{"max_tokens": "3"}, {"max_tokns": 3}, 7, {"max_tokens": 10**400}]),
)
ACTIONS = st.one_of(
    st.just(("read", 0)),
    st.tuples(st.sampled_from(["abort", "close", "cancel"]), st.integers(0, 6)),
    st.just(("abort_first", 0)),
)


@dataclass
class Plan:
    prompt: object
    params: object
    action: tuple[str, int]
    thread: int


PLANS = st.lists(st.builds(Plan, PROMPTS, PARAMS, ACTIONS, st.integers(0, 1)), min_size=1, max_size=12)


def make_engine():
    import hetero_plugins_mock
    from hetero_core.builder import build_engine
    from hetero_core.plugin_system.discovery import load_plugins
    from hetero_core.settings import load_settings

    plugins = load_plugins(entry_points=[], extra_plugins=[("mock", hetero_plugins_mock)])
    return build_engine(load_settings(executor={"name": "mock", "mock": MOCK}, **SETTINGS), plugins)


@lru_cache(maxsize=1)
def solo_engine():
    return make_engine()


def solo(prompt, params):
    """(failed, token ids, finish reason) of the request run alone."""
    try:
        [out] = solo_engine().generate([prompt], [params])
    except InvalidRequestError:
        return True, [], None
    return out.failed, out.output_token_ids, out.finish_reason


async def run_plan(llm, plan: Plan, index: int):
    """(outcome, token ids, finish reason); outcome: 'done', 'refused', 'overloaded' or 'left'
    (closed early or cancelled)."""
    kind, after = plan.action
    request_id = f"r{plan.thread}-{index}"
    stream = llm.generate(plan.prompt, plan.params, request_id)
    deltas = []
    try:
        if kind == "abort_first":
            first = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0)  # it holds its slot; its add is not queued yet
            llm.abort(request_id)
            deltas = [await first] + [d async for d in stream]
        elif kind == "cancel":
            if not await _cancelled_after(stream, after, deltas):
                return _done(deltas)
            return "left", [], None
        else:
            async for delta in stream:
                deltas.append(delta)
                if kind != "read" and len(deltas) == after + 1 and not delta.finished:
                    if kind == "abort":
                        llm.abort(request_id)  # read on: the stream must end with an aborted delta
                    else:
                        await stream.aclose()
                        return "left", [], None
    except (InvalidRequestError, RequestFailedError):
        return "refused", [], None
    except EngineOverloadedError:
        return "overloaded", [], None
    return _done(deltas)


def _done(deltas):
    ids = [t for d in deltas for t in d.token_ids]
    assert deltas[-1].finished and ids == deltas[-1].output.output_token_ids
    return "done", ids, deltas[-1].output.finish_reason


async def _cancelled_after(stream, after: int, deltas: list) -> bool:
    """Read in a task; cancel it once it has ``after + 1`` deltas. False if it finished first."""
    enough = asyncio.Event()

    async def read():
        async for delta in stream:
            deltas.append(delta)
            if len(deltas) == after + 1:
                enough.set()

    reader, waiter = asyncio.ensure_future(read()), asyncio.ensure_future(enough.wait())
    await asyncio.wait({reader, waiter}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if reader.done():
        reader.result()  # raises what the stream raised
        return False
    reader.cancel()
    try:
        await reader
    except asyncio.CancelledError:
        pass
    return True


def run_thread(llm, plans, indices, results):
    async def main():
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(run_plan(llm, plan, i) for plan, i in zip(plans, indices))), HANG_GUARD_S
        )
        results.update(zip(indices, outcomes))

    try:
        asyncio.run(main())
    except BaseException as exc:  # shown by the test's assertion
        results.setdefault("errors", []).append(repr(exc))


@pytest.fixture(scope="module", autouse=True)
def _tally():
    yield
    print_tally("AsyncLLM fuzz")


@fuzz_settings(40)
@given(plans=PLANS, max_pending=st.sampled_from([4, 64]))
def test_async_llm_under_aborts_cancellations_and_bad_input(plans, max_pending):
    results: dict = {}
    with AsyncLLM(make_engine(), max_pending_requests=max_pending) as llm:
        groups = [[(p, i) for i, p in enumerate(plans) if p.thread == t] for t in (0, 1)]
        threads = [
            threading.Thread(target=run_thread, args=(llm, [p for p, _ in g], [i for _, i in g], results))
            for g in groups
            if g
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(HANG_GUARD_S * 2)
        assert not any(t.is_alive() for t in threads), "a stream never ended"
        assert "errors" not in results, results.get("errors")
        assert sorted(results) == list(range(len(plans)))
        assert settle(llm), f"slots or blocks left: {llm.stats}"
    TALLY.update({"examples": 1, "threads": len(threads), "requests": len(plans)})
    for i, plan in enumerate(plans):
        outcome, ids, reason = results[i]
        event(f"{plan.action[0]}: {outcome}" + (f" ({reason})" if reason else ""))
        TALLY[f"{plan.action[0]}: {outcome}"] += 1
        if outcome in ("overloaded", "left"):
            continue
        failed, solo_ids, solo_reason = solo(plan.prompt, plan.params)
        assert (outcome == "refused") == failed, (plan, results[i])
        if outcome == "done" and reason == "abort":
            assert ids == solo_ids[: len(ids)]
        elif outcome == "done":
            assert (ids, reason) == (solo_ids, solo_reason), plan


def settle(llm) -> bool:
    import time

    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        s = llm.stats
        if (
            s.num_pending == 0
            and s.num_running == 0
            and s.num_waiting == 0
            and s.num_free_blocks == s.num_blocks
        ):
            return True
        time.sleep(0.005)
    return False
