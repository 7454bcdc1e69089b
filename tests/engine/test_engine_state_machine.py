"""A hypothesis state machine drives add / abort / step / generate with random valid and invalid
input, plus injected executor faults, on the mock executor (and, shorter, on the real embedded model).
One rule runs generate from several threads at once through ``SharedEngine`` (what ``LLM`` does)
while this thread tries to step, add or abort directly: that is refused (``ConcurrentEngineUseError``)
or, between calls, allowed; every thread's outputs must equal a solo run's on the mock.

After every step: no exception escaped, the allocator is consistent (free + used == total, every
owned block counted once per owner, no free block owned), no request ended twice. At the end:
every accepted request ended exactly once and the engine is empty.

A long run: ``HETERO_FUZZ_EXAMPLES=5000 python -m pytest tests/engine/test_engine_state_machine.py``
(docs/testing.md).
"""

from __future__ import annotations

import threading
from collections import Counter
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, multiple, rule

from hetero_core.engine.requests.params import SamplingParams
from hetero_core.engine.requests.prompts import as_prompt_list
from hetero_core.engine.scheduling.batch import ExecutorOutput
from hetero_core.engine.shared_engine import SharedEngine
from hetero_core.engine.thread_guard import ConcurrentEngineUseError
from hetero_core.errors import InvalidRequestError
from tests.fuzzing import TALLY, fuzz_settings, print_tally

# -- input strategies: valid and invalid ------------------------------------------------------------
TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=24)
PROMPTS = st.one_of(
    TEXT,
    TEXT.filter(bool),
    st.lists(st.integers(-3, 300), max_size=24),
    st.lists(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "system", ""]), "content": TEXT}),
        min_size=0,
        max_size=3,
    ),
    st.sampled_from([None, 42, "caf\ud800", [{"role": "user"}], [{"role": "user", "content": 1}], b"x", 3.5]),
)
PARAM_VALUES = {
    "temperature": st.one_of(st.sampled_from([0, 0.0, 1e-38, 1e-5, 0.7, 1, 2.0, -1, "0.5", float("nan")])),
    "top_p": st.sampled_from([1.0, 0.9, 0.5, 0, 1.5]),
    "top_k": st.sampled_from([-1, 0, 1, 5, True, 2.5]),
    "min_p": st.sampled_from([0.0, 0.1, 2]),
    "repetition_penalty": st.sampled_from([1.0, 1.3, 0.8, 0, 1e-45, 1e-4]),
    "presence_penalty": st.sampled_from([0.0, 0.5, -2, 3]),
    "frequency_penalty": st.sampled_from([0.0, 0.5, 2]),
    "max_tokens": st.one_of(st.integers(-1, 12), st.sampled_from([200, 1.5, None])),
    "stop": st.sampled_from([None, (), "a", ["b", "zz"], 5, [""], ["c", 1]]),
    "stop_token_ids": st.sampled_from([None, [], [40, 41], [-1], 7]),
    "ignore_eos": st.sampled_from([False, True, 1]),
    "logprobs": st.sampled_from([None, 0, 2, 1.5, True, 21]),
    "seed": st.sampled_from([None, 0, -5, 2**64, 10**30, "1"]),
    "include_stop_str_in_output": st.booleans(),
}
VALID_VALUES = {
    "temperature": st.sampled_from([0, 1e-38, 1e-5, 0.7, 1]),
    "top_p": st.sampled_from([1.0, 0.9]),
    "top_k": st.sampled_from([-1, 5]),
    "min_p": st.sampled_from([0.0, 0.1]),
    "repetition_penalty": st.sampled_from([1.0, 1.3, 1e-4, 1e4]),
    "presence_penalty": st.sampled_from([0.0, 0.5]),
    "max_tokens": st.integers(1, 12),
    "stop": st.sampled_from([None, "a", ["e", "t", "a", "o", "i", "n", "s"]]),
    "stop_token_ids": st.sampled_from([None, list(range(40, 60))]),
    "ignore_eos": st.booleans(),
    "logprobs": st.sampled_from([None, 0, 2]),
    "seed": st.sampled_from([None, 0, -5, 2**64, 10**30]),
    "include_stop_str_in_output": st.booleans(),
}
PARAMS = st.one_of(
    st.none(),
    st.fixed_dictionaries({}, optional=VALID_VALUES),
    st.fixed_dictionaries({}, optional=VALID_VALUES),
    st.fixed_dictionaries({}, optional=PARAM_VALUES),  # a dict (the convenience form), maybe invalid
    st.fixed_dictionaries({}, optional={**PARAM_VALUES, "temprature": st.just(1)}),
    st.sampled_from(["greedy", 7, [("temperature", 0)]]),
)
THREAD_PARAMS = st.one_of(  # what one generate call in a thread sends: one params for all its prompts
    st.none(),
    st.fixed_dictionaries({}, optional=VALID_VALUES),
    st.fixed_dictionaries({}, optional=PARAM_VALUES),
)
THREAD_SCRIPTS = st.lists(  # per thread, its generate calls: (prompts, params)
    st.lists(st.tuples(st.lists(PROMPTS, min_size=1, max_size=3), THREAD_PARAMS), min_size=1, max_size=3),
    min_size=2,
    max_size=3,
)


def as_params(raw):
    """Half of the dicts go through SamplingParams first (which may raise InvalidRequestError)."""
    if isinstance(raw, dict) and raw.get("ignore_eos") is True and "temprature" not in raw:
        return SamplingParams(**raw)
    return raw


class FaultyExecutor:
    """Wraps an executor; on demand the next step raises, or (logits executors) one row turns NaN."""

    def __init__(self, inner):
        self.inner, self.raise_next, self.nan_next = inner, False, False

    def execute(self, batch):
        if self.raise_next:
            self.raise_next = False
            raise RuntimeError("injected executor fault")
        output = self.inner.execute(batch)
        if self.nan_next and output.logits is not None and output.logits.shape[0]:
            self.nan_next = False
            logits = output.logits.clone()
            logits[0, 0] = float("nan")
            return ExecutorOutput(logits=logits)
        return output

    def shutdown(self):
        self.inner.shutdown()

    def __getattr__(self, name):  # block transfers (copy-on-write, swap) reach the inner executor
        return getattr(self.inner, name)


class EngineMachine(RuleBasedStateMachine):
    make_engine = None  # set by subclasses: () -> Engine (empty)
    compare_solo = True  # outputs depend only on the request (the mock executor): compare with a solo run
    _solo_engines: dict = {}

    requests = Bundle("requests")

    def __init__(self):
        super().__init__()
        self.engine = type(self).make_engine()
        self.executor = FaultyExecutor(self.engine.executor)
        self.engine.executor = self.executor
        self.accepted: set[str] = set()
        self.finals: Counter[str] = Counter()
        self.shared = SharedEngine(self.engine)

    def record(self, outputs):
        for out in outputs:
            if out.finished:
                self.finals[out.request_id] += 1
                event(f"request ended: {out.finish_reason or 'failed'}")
                assert self.finals[out.request_id] == 1, f"request {out.request_id} ended twice"
                assert out.failed == (out.finish_reason is None), out
                assert "\ufffd" not in out.text[-1:], "text ends in a cut character"

    @rule(target=requests, prompt=PROMPTS, raw=PARAMS)
    def add(self, prompt, raw):
        try:
            request_id = self.engine.add_request(prompt, as_params(raw))
        except InvalidRequestError:
            event("add_request: rejected")
            return multiple()
        event("add_request: accepted")
        self.accepted.add(request_id)
        return request_id

    @rule(request_id=consumes(requests))
    def abort(self, request_id):
        TALLY["aborts"] += self.engine.abort(request_id)

    @rule()
    def abort_unknown(self):
        assert not self.engine.abort("no such request")

    @rule()
    def step(self):
        self.record(self.engine.step())

    @rule(prompts=st.lists(PROMPTS, max_size=3), raw=PARAMS)
    def generate(self, prompts, raw):
        try:
            params = as_params(raw)
        except InvalidRequestError:
            return
        if isinstance(params, list) and len(params) != len(
            as_prompt_list(prompts)
        ):  # one per prompt, or an error
            with pytest.raises(InvalidRequestError, match="sampling params for"):
                self.engine.generate(prompts, params)
            return
        outputs = self.engine.generate(prompts, params)
        prompt_list = as_prompt_list(prompts)
        assert len(outputs) == len(prompt_list) and all(o.finished for o in outputs)
        self.record_own(outputs)
        if self.compare_solo:  # as in the threaded rule: what found the failed swap-ins (issue 25)
            params_list = params if isinstance(params, list) else [params] * len(prompt_list)
            for prompt, p, out in zip(prompt_list, params_list, outputs):
                self.assert_as_solo(prompt, p, out)

    @rule(scripts=THREAD_SCRIPTS, direct=st.sampled_from(["step", "add", "abort", None]))
    def generate_in_threads(self, scripts, direct):
        """Threads call generate on one SharedEngine (as on one LLM) while this thread drives the engine."""
        results, errors = [], []

        def run(script):
            try:
                for prompts, params in script:
                    prompt_list = as_prompt_list(prompts)
                    results.append(
                        (prompt_list, params, self.shared.run(prompt_list, [params] * len(prompt_list)))
                    )
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(script,)) for script in scripts]
        for thread in threads:
            thread.start()
        try:
            self.drive_directly(direct)
        finally:
            for thread in threads:
                thread.join(120)
        assert not any(t.is_alive() for t in threads), "a generate thread hung"
        assert errors == []
        event(f"threads: {len(scripts)}, calls: {len(results)}")
        TALLY.update(
            {
                "threaded rules": 1,
                "threads": len(scripts),
                "calls": len(results),
                "thread requests": sum(len(outputs) for _, _, outputs in results),
            }
        )
        for prompt_list, params, outputs in results:
            assert len(outputs) == len(prompt_list) and all(o.finished for o in outputs)
            self.record_own(outputs)
            if self.compare_solo:
                for prompt, out in zip(prompt_list, outputs):
                    self.assert_as_solo(prompt, params, out)

    def drive_directly(self, action):
        """Step, add or abort from this thread while other threads may be inside the engine."""
        try:
            if action == "step":
                self.record(self.engine.step())
            elif action == "add":
                self.accepted.add(self.engine.add_request("direct", {"max_tokens": 3}))
            elif action == "abort":
                self.engine.abort(next(iter(self.accepted), "none"))
            TALLY[f"direct {action} allowed"] += action is not None
        except ConcurrentEngineUseError:
            event(f"direct {action} refused while threads ran")
            TALLY[f"direct {action} refused"] += 1

    def record_own(self, outputs):
        for out in outputs:  # generate's own requests: one final output each, never seen by step()
            assert out.request_id not in self.finals
            self.finals[out.request_id] = 1

    def assert_as_solo(self, prompt, params, out):
        """A request run among others gives what it gives alone (unless an injected fault failed it)."""
        solo_engine = self._solo_engines.get(type(self))
        if solo_engine is None:
            solo_engine = self._solo_engines[type(self)] = type(self).make_engine()
        [alone] = solo_engine.generate([prompt], [params])
        if alone.failed:
            assert out.failed, f"{prompt!r}: alone it fails ({alone.error}), among threads it ran"
        elif not out.failed:
            assert (out.output_token_ids, out.finish_reason) == (alone.output_token_ids, alone.finish_reason)

    @rule()
    def fail_next_step(self):
        self.executor.raise_next = True

    @rule()
    def poison_next_step(self):
        self.executor.nan_next = True

    @invariant()
    def allocator_is_consistent(self):
        scheduler = self.engine.scheduler
        allocator = scheduler.allocator
        assert allocator.num_free_blocks + allocator.num_used_blocks == allocator.num_blocks
        owners = Counter(b for seq in scheduler.running + scheduler.waiting for b in seq.block_table)
        assert (
            sum(allocator.ref_count(b) > 0 for b in range(allocator.num_blocks)) == allocator.num_used_blocks
        )
        for block, count in owners.items():
            assert allocator.ref_count(block) == count, (
                f"block {block}: {count} owners, count {allocator.ref_count(block)}"
            )

    def teardown(self):
        engine = self.engine
        for _ in range(2000):
            if not (
                engine.has_unfinished_requests() or engine.state.finished_outputs or engine.state.held_outputs
            ):
                break
            self.record(engine.step())
        assert self.accepted <= set(self.finals), f"never ended: {self.accepted - set(self.finals)}"
        assert all(n == 1 for n in self.finals.values())
        assert engine.state.seqs == {} and engine.state.detokenizers == {} and engine.state.held_outputs == {}
        assert not engine.scheduler.waiting and not engine.scheduler.running
        allocator = engine.scheduler.allocator
        assert allocator.num_free_blocks == allocator.num_blocks
        engine.executor = self.executor.inner


@pytest.fixture(scope="module", autouse=True)
def _tally():
    yield
    print_tally("engine state machine")


def build_mock_engine(**overrides):
    import hetero_plugins_mock
    from hetero_core.builder import build_engine
    from hetero_core.plugin_system.discovery import load_plugins
    from hetero_core.settings import load_settings

    settings = load_settings(
        **{
            "executor": {"name": "mock", "mock": {"eos_probability": 0.05}},
            "max_num_blocks": 24,
            "block_size": 4,
            "max_model_len": 96,
            "max_batch_size": 4,
            "max_total_tokens": 24,
            "max_num_seqs": 6,
            "max_tokens": 8,
            **overrides,
        }
    )
    plugins = load_plugins(entry_points=[], extra_plugins=[("mock", hetero_plugins_mock)])
    return build_engine(settings, plugins)


class MockEngineMachine(EngineMachine):
    make_engine = staticmethod(build_mock_engine)


TestEngineOnTheMock = MockEngineMachine.TestCase
TestEngineOnTheMock.settings = fuzz_settings(60, stateful_step_count=30)


class ContiguousMockEngineMachine(EngineMachine):  # the static allocator: room for two reservations
    make_engine = staticmethod(lambda: build_mock_engine(kv_allocator="contiguous", max_num_blocks=48))


TestEngineOnTheMockWithContiguousKV = ContiguousMockEngineMachine.TestCase
TestEngineOnTheMockWithContiguousKV.settings = fuzz_settings(30, stateful_step_count=30)


class AsyncMockEngineMachine(EngineMachine):  # async scheduling: the executor on its own thread
    make_engine = staticmethod(lambda: build_mock_engine(async_scheduling=True, preemption_mode="swap"))


TestEngineOnTheMockWithAsyncScheduling = AsyncMockEngineMachine.TestCase
TestEngineOnTheMockWithAsyncScheduling.settings = fuzz_settings(30, stateful_step_count=30)


class NoTransfersExecutor(FaultyExecutor):
    """Block transfers (copy-on-write, swap) raise: the steps that carry them fail."""

    @property
    def capabilities(self):  # still declared: the engine calls them and they raise
        return self.inner.capabilities

    def __getattr__(self, name):
        raise AttributeError(f"{type(self).__name__} has no {name}")


class AsyncFailingTransfersMachine(AsyncMockEngineMachine):
    def __init__(self):
        super().__init__()
        self.executor.__class__ = NoTransfersExecutor


TestEngineOnTheMockWithAsyncSchedulingAndFailingTransfers = AsyncFailingTransfersMachine.TestCase
# module level: HETERO_FUZZ_EXAMPLES is read at import (the fixtures clear it before a test body runs)
TestEngineOnTheMockWithAsyncSchedulingAndFailingTransfers.settings = fuzz_settings(30, stateful_step_count=30)


class FailingTransferExecutor(FaultyExecutor):
    """One kind of block transfer (``failing``: swap_out, swap_in, copy_blocks) raises; the others run."""

    def __init__(self, inner, failing: set[str]):
        super().__init__(inner)
        self.failing = failing

    def __getattr__(self, name):
        if name in self.__dict__.get("failing", ()):
            raise AttributeError(f"{type(self).__name__} has no {name}")
        return getattr(self.inner, name)


@pytest.mark.parametrize("failing", [{"swap_in"}, {"swap_out"}, {"swap_out", "swap_in"}])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_failed_swaps_fail_their_requests_and_leave_no_block_in_the_prefix_cache(async_scheduling, failing):
    """What the machine above found (issue 25): two requests outgrow a pool of 6 blocks, so one is
    swapped out. A swap-in that failed failed its request, but the blocks it should have filled (they
    held other K/V) were named in the prefix cache as that request's prompt: the same prompt, asked
    again, read them. A swap-out that failed left its request to come back with K/V never copied.
    Now a swap-in's K/V is in flight until its step completes, and a failed step's swap-outs fail."""
    engine = build_mock_engine(async_scheduling=async_scheduling, preemption_mode="swap", max_num_blocks=6)
    engine.executor = FailingTransferExecutor(engine.executor, failing)
    params = {"max_tokens": 8, "ignore_eos": True}
    prompts = [list(range(100, 108)), list(range(120, 128))]
    outputs = engine.generate(prompts, [params] * 2)
    solo = build_mock_engine(async_scheduling=async_scheduling)
    alone = solo.generate(prompts, [params] * 2)
    assert engine.stats().num_swap_preemptions and any(out.failed for out in outputs)
    for out, expected in zip(outputs, alone):
        assert out.failed or out.output_token_ids == expected.output_token_ids
    for prompt, expected in zip(prompts, alone):  # one at a time (no preemption), from the prefix cache
        [again] = engine.generate([prompt], [params])
        assert not again.failed and again.output_token_ids == expected.output_token_ids
    engine.executor = engine.executor.inner


@pytest.mark.slow
def test_engine_on_the_real_model(smollm2_dir):
    from hetero_core.builder import build_engine
    from hetero_core.plugin_system.discovery import load_plugins
    from hetero_core.settings import load_settings

    @lru_cache(maxsize=1)
    def shared_engine():  # loading the model once; each example starts (and must end) empty
        settings = load_settings(
            model=str(smollm2_dir),
            executor="torch",
            max_num_blocks=32,
            block_size=16,
            max_model_len=256,
            max_batch_size=4,
            max_tokens=6,
        )
        return build_engine(settings, load_plugins(entry_points=[]))

    class RealEngineMachine(EngineMachine):
        make_engine = staticmethod(shared_engine)
        compare_solo = False  # one engine for all examples; sampling without a seed differs per run

    run = RealEngineMachine.TestCase
    run.settings = settings(
        max_examples=4, stateful_step_count=10, deadline=None, suppress_health_check=list(HealthCheck)
    )
    run().runTest()


class SpeculativeMockEngineMachine(
    EngineMachine
):  # speculative decoding: ngram proposals verified by the mock
    make_engine = staticmethod(lambda: build_mock_engine(num_speculative_tokens=3, preemption_mode="swap"))


TestEngineOnTheMockWithSpeculativeDecoding = SpeculativeMockEngineMachine.TestCase
TestEngineOnTheMockWithSpeculativeDecoding.settings = fuzz_settings(30, stateful_step_count=30)
