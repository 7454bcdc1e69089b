"""LLM is safe from several threads; the Engine refuses a second thread instead of corrupting its state."""

from __future__ import annotations

import threading
import time

import pytest

from hetero_core import LLM, SamplingParams

MOCK = {"name": "mock", "mock": {"eos_probability": 0.05}}
PARAMS = SamplingParams(max_tokens=20, seed=3)


def make_llm(**settings):
    return LLM(executor=MOCK, **{"max_num_blocks": 64, "block_size": 4, "max_model_len": 128, **settings})


def assert_empty(engine):
    allocator = engine.scheduler.allocator
    assert (
        not engine.has_unfinished_requests() and engine.state.seqs == {} and engine.state.held_outputs == {}
    )
    assert engine.state.finished_outputs == [] and allocator.num_free_blocks == allocator.num_blocks


def solo(prompts, params=PARAMS):
    with make_llm() as llm:
        return {
            p: (o.output_token_ids, o.finish_reason) for p, o in zip(prompts, llm.generate(prompts, params))
        }


def run_threads(target, args_list):
    errors = []

    def guarded(*args):
        try:
            target(*args)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=args) for args in args_list]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors


def wait_until(condition, what):
    deadline = time.monotonic() + 30  # a hang guard, not a timing
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.001)


class GatedExecutor:
    """Wraps an executor; ``on_execute(n)`` runs before the n-th execute (1-based)."""

    def __init__(self, inner, on_execute):
        self.inner, self.on_execute, self.calls, self.batches = inner, on_execute, 0, []

    def execute(self, batch):
        self.calls += 1
        self.batches.append(batch.num_seqs)
        self.on_execute(self.calls)
        return self.inner.execute(batch)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_generate_and_chat_from_several_threads_give_each_caller_its_own_outputs():
    prompts = [f"p{i} " * (i % 7 + 1) for i in range(24)]
    chats = [[{"role": "user", "content": p}] for p in prompts[:6]]
    expected = solo(prompts)
    with make_llm() as llm:
        expected_chat = [(o.output_token_ids, o.finish_reason) for o in llm.chat(chats, PARAMS)]
        wrong = []

        def worker(k):
            for j in range(12):
                start = (k * 5 + j) % 22
                batch = prompts[start : start + 3]
                outs = llm.generate(batch, PARAMS)
                wrong.extend(
                    p for p, o in zip(batch, outs) if (o.output_token_ids, o.finish_reason) != expected[p]
                )
                if j % 4 == 0:
                    got = [(o.output_token_ids, o.finish_reason) for o in llm.chat(chats, PARAMS)]
                    wrong.extend(["chat"] if got != expected_chat else [])

        assert run_threads(worker, [(k,) for k in range(4)]) == []
        assert wrong == []
        assert_empty(llm.engine)


def test_a_thread_arriving_during_a_step_joins_the_next_batch():
    with make_llm() as llm:
        late = {}

        def on_execute(n):
            if n == 1:  # thread A is inside its first step: B arrives and must wait its turn
                threading.Thread(target=lambda: late.update(out=llm.generate("late", PARAMS))).start()
                wait_until(lambda: llm._shared.num_waiting == 1, "thread B waits for the lock")

        gated = llm.engine.executor = GatedExecutor(llm.engine.executor, on_execute)
        [early] = llm.generate("early", SamplingParams(max_tokens=30, ignore_eos=True))
        wait_until(lambda: "out" in late, "thread B's call returned")
        assert max(gated.batches) == 2  # B's request ran in the same steps as A's
        assert (late["out"][0].output_token_ids, early.finish_reason) == (solo(["late"])["late"][0], "length")
        assert_empty(llm.engine)


def test_driving_the_engine_directly_while_calls_run_is_refused():
    from hetero_core.engine.thread_guard import ConcurrentEngineUseError

    with make_llm() as llm:
        inside, release = threading.Event(), threading.Event()

        def on_execute(n):
            if n == 2:
                inside.set()
                release.wait(30)

        llm.engine.executor = GatedExecutor(llm.engine.executor, on_execute)
        result = {}
        worker = threading.Thread(target=lambda: result.update(out=llm.generate(["a", "b"], PARAMS)))
        worker.start()
        assert inside.wait(30)
        for call in (
            llm.engine.step,
            lambda: llm.engine.add_request("x"),
            lambda: llm.engine.abort("0"),
            lambda: llm.engine.generate("y"),
        ):
            with pytest.raises(ConcurrentEngineUseError, match="single-threaded"):
                call()
        release.set()
        worker.join(60)
        assert [(o.output_token_ids, o.finish_reason) for o in result["out"]] == list(
            solo(["a", "b"]).values()
        )
        assert_empty(llm.engine)
        llm.engine.add_request("x", PARAMS)  # one thread at a time is fine again
        while llm.engine.has_unfinished_requests():
            llm.engine.step()


def test_the_engine_refuses_a_second_thread_and_the_first_goes_on():
    from hetero_core.engine.thread_guard import ConcurrentEngineUseError

    with make_llm() as llm:
        engine = llm.engine
        inside, release = threading.Event(), threading.Event()

        def on_execute(n):
            if n == 2:
                inside.set()
                release.wait(30)

        engine.executor = GatedExecutor(engine.executor, on_execute)
        result = {}
        worker = threading.Thread(
            target=lambda: result.update(out=engine.generate(["a"], PARAMS)), name="first"
        )
        worker.start()
        assert inside.wait(30)
        with pytest.raises(ConcurrentEngineUseError, match="thread 'first' was inside it"):
            engine.add_request("intruder", PARAMS)
        release.set()
        worker.join(60)
        assert (result["out"][0].output_token_ids, result["out"][0].finish_reason) == solo(["a"])["a"]
        assert_empty(engine)


def test_a_call_interrupted_in_its_thread_leaves_nothing_behind():
    with make_llm() as llm:

        def on_execute(n):
            if n == 3:
                raise KeyboardInterrupt

        llm.engine.executor = GatedExecutor(llm.engine.executor, on_execute)
        with pytest.raises(KeyboardInterrupt):
            llm.generate(["a", "b"], PARAMS)
        assert_empty(llm.engine)
        outs = llm.generate(["a", "b"], PARAMS)
        assert [(o.output_token_ids, o.finish_reason) for o in outs] == list(solo(["a", "b"]).values())


def test_shutdown_ends_calls_running_in_other_threads_as_aborted():
    llm = make_llm()
    stepped = threading.Event()

    def on_execute(n):  # the first step waits until shutdown queues for the lock (else 100 steps may
        stepped.set()  # all run before this thread is scheduled again)
        deadline = time.monotonic() + 10
        while n == 1 and llm._shared.num_waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.001)

    llm.engine.executor = GatedExecutor(llm.engine.executor, on_execute)
    result = {}
    worker = threading.Thread(
        target=lambda: result.update(
            out=llm.generate("long", SamplingParams(max_tokens=100, ignore_eos=True))
        )
    )
    worker.start()
    assert stepped.wait(30)
    llm.shutdown()
    worker.join(60)
    assert result["out"][0].finish_reason == "abort"
    assert llm.engine.state.seqs == {} and not llm.engine.has_unfinished_requests()
