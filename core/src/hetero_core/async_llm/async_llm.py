"""AsyncLLM: the engine behind an asyncio front door, stepped by one loop thread (``EngineLoop``).

Requests arrive from any thread or asyncio task; each gets an async iterator of ``RequestDelta``
(the text, tokens and logprobs new since the previous one). A request's way in:

1. checked in the caller, before it takes anything: sampling parameters (``SamplingParams`` or a
   dict of their fields), priority, tenant, request id, the prompt's shape, and a size bound that
   refuses without tokenizing a prompt that can never fit ``max_model_len``;
2. it takes one of ``max_pending_requests`` slots; the generator owns the slot and gives it back in
   its ``finally``, whichever way it ends (finished, failed, aborted, closed early, cancelled);
3. tokenized in a worker thread (``asyncio.to_thread``), so neither the engine loop nor the caller's
   event loop waits on a long prompt;
4. handed to the loop thread, which only admits it (bounded work) and streams its deltas back
   through ``loop.call_soon_threadsafe``.

``abort(request_id)`` (any thread) ends the request's stream with a final delta whose
``finish_reason`` is "abort"; closing the iterator early or cancelling its task aborts it too.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator
from dataclasses import replace

from hetero_core.async_llm.engine_loop import EngineLoop, EngineStats
from hetero_core.async_llm.errors import EngineDeadError, EngineOverloadedError
from hetero_core.async_llm.request_stream import RequestDelta, RequestStream
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.engine.requests.processor import CheckedRequest, EngineRequest
from hetero_core.errors import InvalidRequestError

__all__ = ["AsyncLLM"]
DEFAULT_MAX_PENDING_REQUESTS = 512


class AsyncLLM:
    """Serve one engine to many concurrent asyncio callers. Use ``shutdown()`` (or ``with``) to stop."""

    def __init__(
        self, engine, *, max_pending_requests: int = DEFAULT_MAX_PENDING_REQUESTS, observer=None
    ) -> None:
        self.engine = engine
        self.max_pending_requests = max_pending_requests
        self._streams: dict[str, RequestStream] = {}  # one per slot taken
        self._streams_lock = threading.Lock()
        self._ids = itertools.count()
        self._engine_closed = False
        self._loop = EngineLoop(engine, observer=observer)

    @classmethod
    def from_settings(cls, settings=None, **kwargs) -> AsyncLLM:
        """Build the engine from settings (the one place the async front end uses the builder)."""
        from hetero_core.builder import build_engine

        return cls(build_engine(settings), **kwargs)

    # -- callers (any thread / task) -------------------------------------------------------------
    async def generate(
        self,
        prompt,
        params: SamplingParams | dict | None = None,
        request_id: str | None = None,
        *,
        fit_max_tokens: bool = False,
        priority: int | None = None,
        tenant: str | None = None,
        kv_transfer=None,
        export_kv: bool = False,
    ) -> AsyncIterator[RequestDelta]:
        """Submit a request and yield its deltas until it finishes; the last has ``finished``.

        ``params``: SamplingParams, a dict of their fields over the engine's defaults, or None.
        ``fit_max_tokens``: lower ``max_tokens`` so that prompt + output fit ``max_model_len``
        (for callers that did not choose a length). Raises ``InvalidRequestError`` for input the
        engine refuses, ``RequestFailedError`` if the engine fails the request, ``EngineOverloadedError``
        beyond ``max_pending_requests``, ``EngineDeadError`` once stopped. Closing the iterator early
        (a client that went away) or cancelling the task aborts the request and frees its blocks.
        ``kv_transfer`` / ``export_kv``: prefill/decode disaggregation, as for ``Engine.add_request``.
        """
        checked = self._check(prompt, params, request_id, priority, tenant)
        stream = self._open(request_id)
        submitted = finished = False
        try:
            request = await asyncio.to_thread(self.engine.processor.tokenize, checked)
            if kv_transfer is not None or export_kv:
                request = replace(request, kv_transfer=kv_transfer, export_kv=export_kv)
            stream.start(_fit(request, self.engine.max_model_len) if fit_max_tokens else request)
            self._loop.add(stream)
            submitted = True
            while not finished:
                item = await stream.sink.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                if finished:  # the slot is free once the last delta is out, read to the end or not
                    self._close(stream)
                yield item
        finally:
            if submitted and not finished:
                self._loop.abort(stream.request_id)
            self._close(stream)

    def abort(self, request_id: str) -> None:
        """Abort a request from any thread: its stream ends with a final delta whose
        ``finish_reason`` is "abort", and its blocks are freed before the next step. An id that is
        not pending (unknown, finished) is ignored."""
        with self._streams_lock:
            stream = self._streams.get(request_id) if isinstance(request_id, str) else None
            if stream is None:
                return
            stream.abort_requested = True
        self._loop.abort(request_id)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Fail pending requests as aborted, stop the loop thread, shut the engine down."""
        if self._loop.stop(timeout) and not self._engine_closed:
            self._engine_closed = True
            self.engine.shutdown()

    def __enter__(self) -> AsyncLLM:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    @property
    def stats(self) -> EngineStats:
        """The loop's latest snapshot, with the slots taken now."""
        with self._streams_lock:
            num_pending = len(self._streams)
        return replace(self._loop.stats, num_pending=num_pending)

    @property
    def is_running(self) -> bool:
        return self._loop.is_running

    @property
    def dead_reason(self) -> str | None:
        return self._loop.dead_reason

    @property
    def observer(self):
        return self._loop.observer

    # -- a request's slot ----------------------------------------------------------------------------
    def _check(self, prompt, params, request_id, priority, tenant) -> CheckedRequest:
        """Everything about the request that needs no tokenizer; nothing is taken yet."""
        if request_id is not None and not isinstance(request_id, str):
            raise InvalidRequestError(f"request_id must be a string, got {type(request_id).__name__}")
        checked = self.engine.processor.check(
            prompt, params, priority=0 if priority is None else priority, tenant=tenant
        )
        if checked.params.num_samples > 1:
            raise InvalidRequestError(
                "AsyncLLM streams one completion per request: n and best_of must be 1, "
                f"got n={checked.params.n}, best_of={checked.params.best_of}; "
                "send n requests (seed + i each, as the server does) or use LLM.generate"
            )
        return checked

    def _open(self, request_id: str | None) -> RequestStream:
        """Take a slot: the stream of a new request (given back by ``_close``)."""
        loop = asyncio.get_running_loop()
        with self._streams_lock:
            if not self.is_running:
                raise EngineDeadError(f"the engine is not running: {self.dead_reason or 'shut down'}")
            if len(self._streams) >= self.max_pending_requests:
                raise EngineOverloadedError(
                    f"the server is at its limit of {self.max_pending_requests} pending requests "
                    "(max_pending_requests); retry later"
                )
            if request_id is None:
                request_id = next(i for i in (f"async-{n}" for n in self._ids) if i not in self._streams)
            elif request_id in self._streams:
                raise InvalidRequestError(f"request id {request_id!r} is already in use by a pending request")
            stream = self._streams[request_id] = RequestStream(request_id, loop, asyncio.Queue())
            return stream

    def _close(self, stream: RequestStream) -> None:
        with self._streams_lock:
            if self._streams.get(stream.request_id) is stream:
                del self._streams[stream.request_id]


def _fit(request: EngineRequest, max_model_len: int) -> EngineRequest:
    """``max_tokens`` lowered so that prompt + output fit ``max_model_len``."""
    room = max_model_len - len(request.prompt_token_ids)
    if 0 < room < request.params.max_tokens:
        return replace(request, params=replace(request.params, max_tokens=room))
    return request
