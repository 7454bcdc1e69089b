"""One API request's choices run as engine requests together, merged into one stream of deltas.

A request with several prompts or ``n > 1`` becomes one engine request per choice. ``start()``
waits for every choice's first delta, so input the engine refuses becomes a 4xx before any response
header is sent. With ``n > 1`` a prompt's first choice starts alone and the others once it has its
first token: they find its prompt in the prefix cache and share its KV blocks, as the engine's own
``SamplingParams(n=...)`` does (``engine/requests/parallel_sampling.py``), instead of n prefills;
``deltas()`` then yields ``(choice index, delta)`` as the engine produces them.
Closing the generation (client gone, error, done) aborts whatever still runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field

from fastapi import Request
from starlette.responses import StreamingResponse

from hetero_core.async_llm import AsyncLLM, RequestDelta, TokenLogprob
from hetero_core.engine.requests.outputs import RequestOutput
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.openai_api.convert import finish_reason  # noqa: F401  (re-exported for the routes)
from hetero_core.server.choices import Reservation
from hetero_core.server.errors import ClientDisconnected

_DONE = object()


@dataclass(frozen=True)
class ChoiceSpec:
    prompt: object  # str, token ids or chat messages
    params: SamplingParams
    fit_max_tokens: bool = False


class Generation:
    def __init__(
        self,
        llm: AsyncLLM,
        request_id: str,
        specs: list[ChoiceSpec],
        *,
        priority: int | None = None,
        tenant: str | None = None,
        reservation: Reservation | None = None,
        num_per_prompt: int = 1,
    ) -> None:
        self._reservation = reservation  # given back when the generation closes
        self._num_per_prompt = num_per_prompt  # choices of one prompt, consecutive in ``specs``
        self._streams = [
            llm.generate(
                spec.prompt,
                spec.params,
                f"{request_id}-{i}",
                fit_max_tokens=spec.fit_max_tokens,
                priority=priority,
                tenant=tenant,
            )
            for i, spec in enumerate(specs)
        ]
        self._firsts: list[RequestDelta] = []
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        """Wait for each choice's first delta (each prompt's first choice before its others, which then
        share its prompt's blocks); on the first error, stop the other choices where they are (no
        waiting for their first tokens), close every choice and raise it."""
        indices = range(len(self._streams))
        leaders = [i for i in indices if i % self._num_per_prompt == 0]
        followers = [i for i in indices if i % self._num_per_prompt]
        firsts: dict[int, RequestDelta] = {}
        for group in (leaders, followers):
            if group:
                firsts.update(zip(group, await self._first_deltas(group)))
        self._firsts = [firsts[i] for i in indices]

    async def _first_deltas(self, indices: list[int]) -> list[RequestDelta]:
        firsts = [asyncio.ensure_future(anext(self._streams[i])) for i in indices]
        try:
            await asyncio.wait(firsts, return_when=asyncio.FIRST_EXCEPTION)
        finally:  # also when cancelled (the client left): no first may outlive start()
            unfinished = [f for f in firsts if not f.done()]
            for first in unfinished:
                first.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)
        errors = [f.exception() for f in firsts if not f.cancelled() and f.exception() is not None]
        if errors:
            await self.aclose()
            raise errors[0]
        return [f.result() for f in firsts]

    async def deltas(self) -> AsyncIterator[tuple[int, RequestDelta]]:
        merged: asyncio.Queue = asyncio.Queue()
        num_open = 0
        for i, first in enumerate(self._firsts):
            yield i, first
            if not first.finished:
                num_open += 1
                self._tasks.append(asyncio.create_task(_pump(i, self._streams[i], merged)))
        while num_open:
            i, item = await merged.get()
            if item is _DONE:
                num_open -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for stream in self._streams:
            await stream.aclose()
        if self._reservation is not None:
            self._reservation.release()


async def _pump(index: int, stream, merged: asyncio.Queue) -> None:
    try:
        async for delta in stream:
            merged.put_nowait((index, delta))
    except Exception as exc:
        merged.put_nowait((index, exc))
    merged.put_nowait((index, _DONE))


@dataclass
class ChoiceResult:
    """A finished choice, collected from its deltas."""

    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    output: RequestOutput | None = None


async def collect(generation: Generation, num_choices: int) -> list[ChoiceResult]:
    results = [ChoiceResult() for _ in range(num_choices)]
    async for i, delta in generation.deltas():
        results[i].text += delta.text
        results[i].logprobs += delta.logprobs or []
        results[i].output = delta.output
    return results


async def run_choices(
    request: Request,
    state,
    body,
    request_id: str,
    prompts: list,
    max_tokens: int | None,
    num_logprobs: int | None,
    num_per_prompt: int | None = None,
) -> tuple[Generation, int, list[ChoiceResult] | None]:
    """Submit every choice (``num_per_prompt`` per prompt, default ``n``; more for ``best_of``) of an
    endpoint's request and wait for their first deltas; returns the generation, its number of choices
    and, unless the request streams, their results."""
    num_per_prompt = num_per_prompt or body.n
    reservation = state.choices.reserve(
        len(prompts), num_per_prompt
    )  # 400 / 429 here, before any engine work
    try:
        specs = state.choice_specs(body, prompts, max_tokens, num_logprobs, num_per_prompt)
    except BaseException:
        reservation.release()
        raise
    generation = Generation(
        state.llm,
        request_id,
        specs,
        priority=body.priority,
        tenant=body.user,
        reservation=reservation,
        num_per_prompt=num_per_prompt,
    )
    await until_disconnected(request, generation.start(), generation)
    if body.stream:
        return generation, len(specs), None
    try:
        results = await until_disconnected(request, collect(generation, len(specs)), generation)
    finally:
        await generation.aclose()
    return generation, len(specs), results


async def until_disconnected(request: Request, work: Awaitable, generation: Generation):
    """Await ``work``; if the client disconnects first, abort the generation and raise."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await generation.aclose()
    raise ClientDisconnected("generation")


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def sse(payload) -> str:
    """One event. Models are written whole, nulls included as in the JSON answers (OpenAI's chunks carry
    ``"finish_reason": null``; dropping nulls would drop required ones such as a token's ``logprob``)."""
    data = payload if isinstance(payload, str) else payload.model_dump_json()
    return f"data: {data}\n\n"


class EventStream(StreamingResponse):
    """Server-sent events of ``generation``; the events and the generation are always closed, even if the
    client left before the first event (so an unread stream is aborted and its choices given back)."""

    def __init__(self, events: AsyncIterator[str], generation: Generation) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.generation = generation

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()
            await self.generation.aclose()
