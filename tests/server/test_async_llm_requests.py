"""AsyncLLM request lifecycle: aborts end streams, slots are given back on every path, and the loop
thread never tokenizes (a huge prompt is refused unread; other streams go on while one is tokenized)."""

from __future__ import annotations

import asyncio
import threading
import types

import pytest

from hetero_core.async_llm import AsyncLLM, EngineOverloadedError
from hetero_core.default_plugins.byte_tokenizer import ByteTokenizer
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.errors import InvalidRequestError
from hetero_core.plugin_system.hookspecs import hookimpl

HANG_GUARD_S = 30  # only to turn a hang into a failure; nothing here measures time
LONG = SamplingParams(max_tokens=1000, ignore_eos=True)


class WatchedTokenizer(ByteTokenizer):
    """The byte tokenizer, recording which thread encodes how many characters; encoding a text that
    starts with "BLOCK" waits until ``gate`` is set."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.gate, self.entered = threading.Event(), threading.Event()
        self.gate_opened = None

    def encode(self, text):
        self.calls.append((threading.current_thread().name, len(text)))
        if text.startswith("BLOCK"):
            self.entered.set()
            self.gate_opened = self.gate.wait(HANG_GUARD_S)
        return super().encode(text)


def make_engine(tokenizer, mock_options=None, **settings):
    import hetero_plugins_mock
    from hetero_core.builder import build_engine
    from hetero_core.plugin_system.discovery import load_plugins
    from hetero_core.settings import load_settings

    plugin = types.SimpleNamespace(
        register_tokenizers=hookimpl(lambda register: register("watched", lambda ctx: tokenizer))
    )
    plugins = load_plugins(
        entry_points=[], extra_plugins=[("mock", hetero_plugins_mock), ("watched", plugin)]
    )
    executor = {"name": "mock", "mock": mock_options or {"decode_latency_per_step": 0.001}}
    return build_engine(load_settings(executor=executor, tokenizer="watched", **settings), plugins)


async def settled(llm) -> bool:
    """Wait (bounded) until no request holds a slot or a KV block."""
    for _ in range(HANG_GUARD_S * 200):
        s = llm.stats
        if s.num_pending == 0 and s.num_running == 0 and s.num_free_blocks == s.num_blocks:
            return True
        await asyncio.sleep(0.005)
    return False


async def collect(stream):
    return [d async for d in stream]


def test_abort_from_the_caller_ends_the_stream_with_an_aborted_delta():
    with AsyncLLM(make_engine(WatchedTokenizer())) as llm:

        async def main():
            streams = [llm.generate(f"r{i}", LONG, f"r{i}") for i in range(6)]
            firsts = [await anext(s) for s in streams]
            for i in range(0, 6, 2):
                llm.abort(f"r{i}")
            for i in range(0, 6, 2):
                rest = await asyncio.wait_for(collect(streams[i]), HANG_GUARD_S)
                assert rest[-1].finished and rest[-1].output.finish_reason == "abort"
            for i in range(1, 6, 2):
                await streams[i].aclose()
            assert not firsts[0].finished and await settled(llm)

        asyncio.run(main())


def test_abort_before_the_request_reaches_the_loop_still_ends_its_stream():
    with AsyncLLM(make_engine(WatchedTokenizer())) as llm:

        async def main():
            stream = llm.generate("early", LONG, "early")
            first = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0)  # the request holds its slot; its add is not queued yet
            llm.abort("early")
            last = await asyncio.wait_for(first, HANG_GUARD_S)
            assert last.finished and last.output.finish_reason == "abort"
            assert await settled(llm)

        asyncio.run(main())


@pytest.mark.parametrize(
    "params, message",
    [
        ({"max_tokens": "3"}, "max_tokens must be an integer"),
        ({"max_tokns": 3}, "did you mean 'max_tokens'"),
        (7, "must be a SamplingParams or a dict, got int"),
    ],
)
def test_bad_params_are_refused_before_taking_a_slot(params, message):
    with AsyncLLM(make_engine(WatchedTokenizer()), max_pending_requests=2) as llm:

        async def main():
            for _ in range(5):  # more than max_pending_requests: none may keep a slot
                with pytest.raises(InvalidRequestError, match=message):
                    await anext(llm.generate("x", params))
            deltas = await collect(llm.generate("x", {"max_tokens": 3}))  # a dict over the defaults
            assert len(deltas[-1].output.output_token_ids) == 3 and deltas[-1].finished
            assert llm.stats.num_pending == 0

        asyncio.run(main())


def test_every_way_a_request_ends_gives_its_slot_back():
    tokenizer = WatchedTokenizer()
    fits = SamplingParams(max_tokens=100, ignore_eos=True)
    with AsyncLLM(make_engine(tokenizer, max_model_len=128), max_pending_requests=1) as llm:

        async def main():
            with pytest.raises(InvalidRequestError):  # refused by the engine (too long)
                await anext(llm.generate("x" * 130, SamplingParams(max_tokens=10)))
            with pytest.raises(InvalidRequestError):  # refused before the slot (no such prompt)
                await anext(llm.generate(None))
            stream = llm.generate("closed early", fits)
            await anext(stream)
            await stream.aclose()
            task = asyncio.ensure_future(collect(llm.generate("cancelled", fits)))
            while not llm.stats.num_pending:
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            blocked = asyncio.ensure_future(collect(llm.generate("BLOCK cancelled while tokenized", fits)))
            await asyncio.to_thread(tokenizer.entered.wait, HANG_GUARD_S)
            blocked.cancel()
            with pytest.raises(asyncio.CancelledError):
                await blocked
            tokenizer.gate.set()
            with pytest.raises(EngineOverloadedError):  # the one slot is really taken while a stream runs
                stream = llm.generate("holder", fits)
                await anext(stream)
                await anext(llm.generate("second", fits))
            await stream.aclose()
            deltas = await collect(llm.generate("last", SamplingParams(max_tokens=4)))
            assert deltas[-1].finished and await settled(llm)

        asyncio.run(main())


def test_a_huge_prompt_is_refused_without_tokenizing_it():
    tokenizer = WatchedTokenizer()
    with AsyncLLM(make_engine(tokenizer, max_model_len=256)) as llm:

        async def main():
            with pytest.raises(InvalidRequestError, match="max_model_len .* refused without tokenizing"):
                await anext(llm.generate("y" * 15_000_000, SamplingParams(max_tokens=4)))
            with pytest.raises(InvalidRequestError, match="max_model_len"):
                await anext(
                    llm.generate([{"role": "user", "content": "y" * 1_000_000}], SamplingParams(max_tokens=4))
                )
            with pytest.raises(InvalidRequestError, match="token ids"):
                await anext(llm.generate([65] * 1_000_000, SamplingParams(max_tokens=4)))

        asyncio.run(main())
    assert max((n for _, n in tokenizer.calls), default=0) < 256


def test_the_loop_never_tokenizes_and_other_streams_go_on_meanwhile():
    tokenizer = WatchedTokenizer()
    with AsyncLLM(make_engine(tokenizer)) as llm:

        async def main():
            other = llm.generate("a concurrent stream", LONG)
            await anext(other)
            blocked = asyncio.ensure_future(
                collect(llm.generate("BLOCK until the other stream moved", SamplingParams(max_tokens=3)))
            )
            await asyncio.to_thread(tokenizer.entered.wait, HANG_GUARD_S)
            num_tokens = 0
            while num_tokens < 20:  # the other stream advances while the prompt is being tokenized
                num_tokens += len((await asyncio.wait_for(anext(other), HANG_GUARD_S)).token_ids)
            tokenizer.gate.set()
            deltas = await asyncio.wait_for(blocked, HANG_GUARD_S)
            assert deltas[-1].finished and len(deltas[-1].output.output_token_ids) == 3
            await other.aclose()

        asyncio.run(main())
    assert tokenizer.gate_opened is True
    assert "hetero-engine-loop" not in {name for name, _ in tokenizer.calls}
