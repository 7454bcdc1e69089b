"""AsyncLLM: the engine behind an asyncio front door, stepped by one loop thread.

Requests arrive from any thread or asyncio task; each gets an async iterator of ``RequestDelta``
(the text, tokens and logprobs new since the previous one). Only the loop thread touches the engine:
``generate`` and ``abort`` put commands on a thread-safe queue that the loop drains between steps, so
adding and aborting are safe while a step runs, and requests that arrive together join the same
batches. Deltas reach each request's ``asyncio.Queue`` through ``loop.call_soon_threadsafe``.

A step that raises fails the requests it was running (``EngineStepError``, with the reason) and the
loop keeps serving the others; if the engine cannot even abort them, or the executor is dead
(``ExecutorDeadError``: a tensor-parallel worker died), the engine is marked dead and every
request, current and future, fails with ``EngineDeadError``.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from hetero_core.engine.outputs import RequestOutput
from hetero_core.engine.params import SamplingParams
from hetero_core.errors import ExecutorDeadError, HeteroError, InvalidRequestError
from hetero_core.logging import get_logger
from hetero_core.request_stream import RequestDelta, RequestStream, TokenLogprob

__all__ = [
    "AsyncLLM", "EngineDeadError", "EngineOverloadedError", "EngineStats", "EngineStepError",
    "RequestDelta", "RequestFailedError", "TokenLogprob",
]
log = get_logger("hetero.async_llm")
DEFAULT_MAX_PENDING_REQUESTS = 512
IDLE_STEP_WAIT_S = 0.002


class RequestFailedError(HeteroError):
    """The engine reported the request failed (e.g. it can never fit ``max_model_len``)."""


class EngineStepError(RequestFailedError):
    """An engine step raised while this request was in it."""


class EngineDeadError(HeteroError):
    """The engine loop has stopped (shut down, or the engine became inconsistent)."""


class EngineOverloadedError(HeteroError):
    """More requests are pending than ``max_pending_requests`` allows."""


@dataclass(frozen=True)
class EngineStats:
    """A snapshot the loop thread publishes after every step (safe to read from any thread)."""

    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    num_pending: int = 0  # requests accepted by AsyncLLM and not finished
    num_blocks: int = 0
    num_free_blocks: int = 0
    num_steps: int = 0
    last_step_batch_size: int = 0
    max_step_batch_size: int = 0
    prefix_cache_hit_rate: float | None = None  # when the KV allocator keeps a prefix cache
    num_queued_tokens: int = 0  # prompt + remaining output tokens of unfinished requests (see below)


class AsyncLLM:
    """Serve one engine to many concurrent asyncio callers. Use ``shutdown()`` (or ``with``) to stop."""

    def __init__(self, engine, *, max_pending_requests: int = DEFAULT_MAX_PENDING_REQUESTS,
                 observer=None) -> None:
        self.engine = engine
        self.max_pending_requests = max_pending_requests
        self.observer = observer  # optional: on_step(batch_size), on_output(output, num_new_tokens)
        self.stats = EngineStats(num_blocks=engine.scheduler.allocator.num_blocks,
                                 num_free_blocks=engine.scheduler.allocator.num_free_blocks)
        self.dead_reason: str | None = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._requests: dict[str, RequestStream] = {}  # loop thread only
        self._num_pending = 0
        self._pending_lock = threading.Lock()
        self._ids = itertools.count()
        self._batch_sizes = _BatchSizeRecorder(engine)
        self._num_steps = self._last_batch_size = self._max_batch_size = 0
        self._flush_needed = False
        self._idle_step = False
        self._engine_closed = False
        self._closed = False  # set by the loop thread when it exits
        self._submit_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="hetero-engine-loop", daemon=True)
        self._thread.start()

    @classmethod
    def from_settings(cls, settings=None, **kwargs) -> AsyncLLM:
        """Build the engine from settings (the one place the async front end uses the builder)."""
        from hetero_core.builder import build_engine

        return cls(build_engine(settings), **kwargs)

    # -- callers (any thread / task) -------------------------------------------------------------
    async def generate(self, prompt, params: SamplingParams | None = None, request_id: str | None = None, *,
                       fit_max_tokens: bool = False, priority: int | None = None,
                       tenant: str | None = None) -> AsyncIterator[RequestDelta]:
        """Submit a request and yield its deltas until it finishes; the last has ``finished``.

        ``fit_max_tokens``: lower ``max_tokens`` so that prompt + output fit ``max_model_len``
        (for callers that did not choose a length). Raises ``InvalidRequestError`` for input the
        engine refuses, ``RequestFailedError`` if the engine fails the request, ``EngineOverloadedError``
        beyond ``max_pending_requests``, ``EngineDeadError`` once stopped. Closing the iterator early
        (a client that went away) aborts the request and frees its blocks.
        """
        self._reserve_slot()
        request_id = request_id or f"async-{next(self._ids)}"
        sink: asyncio.Queue = asyncio.Queue()
        extras = {"priority": priority, "tenant": tenant}
        request = RequestStream(request_id, prompt, params or self.engine.default_params, fit_max_tokens,
                                extras, asyncio.get_running_loop(), sink)
        finished = False
        try:
            self._submit(("add", request))
            while not finished:
                item = await sink.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Abort a request from any thread; its blocks are freed before the next step."""
        with self._submit_lock:
            if not self._closed:
                self._commands.put(("abort", request_id))

    def _submit(self, command) -> None:
        with self._submit_lock:
            if self._closed:  # the loop has exited: nobody would answer
                self._release_slot()
                raise EngineDeadError(f"the engine is not running: {self.dead_reason or 'shut down'}")
            self._commands.put(command)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Fail pending requests as aborted, stop the loop thread, shut the engine down."""
        if self._thread.is_alive():
            self._commands.put(("stop", None))
            self._thread.join(timeout)
        if not self._thread.is_alive() and not self._engine_closed:
            self._engine_closed = True
            self.engine.shutdown()

    def __enter__(self) -> AsyncLLM:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and self.dead_reason is None

    def _reserve_slot(self) -> None:
        if not self.is_running:
            raise EngineDeadError(f"the engine is not running: {self.dead_reason or 'shut down'}")
        with self._pending_lock:
            if self._num_pending >= self.max_pending_requests:
                raise EngineOverloadedError(
                    f"the server is at its limit of {self.max_pending_requests} pending requests "
                    "(max_pending_requests); retry later"
                )
            self._num_pending += 1

    def _release_slot(self) -> None:
        with self._pending_lock:
            self._num_pending -= 1

    # -- the loop thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        stopping = False
        while not stopping:
            try:
                # Nothing to run: sleep until a command comes. A step that ran nothing (the
                # scheduler is waiting for room): wait briefly for a command instead of spinning.
                busy = self._requests or self._flush_needed
                timeout = None if not busy else (IDLE_STEP_WAIT_S if self._idle_step else 0)
                stopping = self._drain_commands(timeout)
                if (self._requests or self._flush_needed) and not stopping:
                    self._step()
                self._publish_stats()
            except Exception as exc:  # a bug in this loop: say so and fail everyone, never hang
                self.dead_reason = f"engine loop failed: {type(exc).__name__}: {exc}"
                log.error("engine.dead", reason=self.dead_reason)
                stopping = True
        with self._submit_lock:  # after this, generate() refuses at once instead of queueing
            self._closed = True
        self._fail_all(lambda r: EngineDeadError("the engine was shut down; the request was aborted"))
        self.dead_reason = self.dead_reason or "shut down"
        while True:  # requests queued before the close get an answer too
            try:
                kind, value = self._commands.get_nowait()
            except queue.Empty:
                break
            if kind == "add":
                self._reply_error(value, EngineDeadError("the engine was shut down before the request started"))

    def _drain_commands(self, timeout: float | None) -> bool:
        """Apply queued commands, waiting up to ``timeout`` for the first (None: forever); True to stop."""
        try:
            command = self._commands.get(timeout=timeout) if timeout != 0 else self._commands.get_nowait()
            while True:
                kind, value = command
                if kind == "stop":
                    return True
                self._add(value) if kind == "add" else self._abort(value)
                command = self._commands.get_nowait()
        except queue.Empty:
            return False

    def _add(self, request: RequestStream) -> None:
        if self.dead_reason is not None:
            return self._reply_error(request, EngineDeadError(f"the engine is not running: {self.dead_reason}"))
        try:
            prompt, params = request.prompt, request.params
            if request.fit_max_tokens:
                prompt, params = self._fit(prompt, params)
            extras = {k: v for k, v in request.extras.items() if v is not None}
            self.engine.add_request(prompt, params, request.request_id, **extras)
        except InvalidRequestError as exc:
            return self._reply_error(request, InvalidRequestError(str(exc)))
        except Exception as exc:  # a tokenizer bug must not take the loop down
            log.error("request.add_failed", request_id=request.request_id, error=repr(exc))
            return self._reply_error(request, RequestFailedError(f"could not add the request: {exc!r}"))
        request.params = params
        request.hold_chars = max((len(s) for s in params.stop), default=1) - 1
        self._requests[request.request_id] = request

    def _fit(self, prompt, params: SamplingParams):
        tokenizer = self.engine.tokenizer
        if isinstance(prompt, str):
            prompt = tokenizer.encode(prompt)
        elif prompt and all(isinstance(m, dict) for m in prompt):
            prompt = tokenizer.encode_chat(prompt)
        room = self.engine.max_model_len - len(prompt)
        if 0 < room < params.max_tokens:
            params = replace(params, max_tokens=room)
        return prompt, params

    def _abort(self, request_id: str) -> None:
        if request_id in self._requests:
            self._requests.pop(request_id)
            self._release_slot()
            self.engine.abort(request_id)
            self._flush_needed = True  # the abort's output comes with the next step

    def _step(self) -> None:
        self._flush_needed = False
        running_before = {s.request_id for s in self.engine.scheduler.running}
        try:
            outputs = self.engine.step()
        except Exception as exc:  # fail what the step touched; keep serving the rest
            return self._recover(exc, running_before)
        batch_size = self._batch_sizes.take()
        if batch_size:
            self._record_step(batch_size)
        self._idle_step = not batch_size and not outputs
        for out in outputs:
            request = self._requests.get(out.request_id)
            if request is not None:
                self._deliver(request, out)
            elif self.observer is not None:  # e.g. the abort of a request whose client went away
                self.observer.on_output(out, 0)
        if not outputs and self._requests and not self.engine.has_unfinished_requests():
            self._fail_all(lambda r: RequestFailedError("the engine lost track of the request"))

    def _deliver(self, request: RequestStream, out: RequestOutput) -> None:
        if self.observer is not None:
            self.observer.on_output(out, len(out.output_token_ids) - request.num_sent_tokens)
        if out.error is not None:
            self._finish(request)
            return self._reply_error(request, RequestFailedError(out.error), release=False)
        if out.finished:
            self._finish(request)
        if not request.send(request.delta(out, self.engine.tokenizer)) and not out.finished:
            self._abort(request.request_id)

    def _finish(self, request: RequestStream) -> None:
        self._requests.pop(request.request_id, None)
        self._release_slot()

    def _recover(self, exc: Exception, running_before: set[str]) -> None:
        reason = f"engine step failed: {type(exc).__name__}: {exc}"
        log.error("engine.step_failed", error=reason)
        if isinstance(exc, ExecutorDeadError):  # nothing can run any more: every request fails with it
            self.dead_reason = str(exc)
            log.error("engine.dead", reason=self.dead_reason)
            self._fail_all(lambda r: EngineDeadError(f"the engine stopped: {self.dead_reason}"))
            return
        affected = (running_before | {s.request_id for s in self.engine.scheduler.running}) & set(self._requests)
        affected = affected or set(self._requests)
        try:
            for request_id in affected:
                self.engine.abort(request_id)
        except Exception as abort_exc:
            self.dead_reason = f"{reason}; then abort failed: {abort_exc!r}"
            log.error("engine.dead", reason=self.dead_reason)
            self._fail_all(lambda r: EngineDeadError(f"the engine stopped: {self.dead_reason}"))
            return
        for request_id in affected:
            request = self._requests.pop(request_id)
            self._reply_error(request, EngineStepError(reason), release=True)

    def _fail_all(self, make_error) -> None:
        for request in list(self._requests.values()):
            self._requests.pop(request.request_id)
            self._reply_error(request, make_error(request), release=True)

    def _reply_error(self, request: RequestStream, error: BaseException, release: bool = True) -> None:
        if release:
            self._release_slot()
        request.send(error)

    def _record_step(self, batch_size: int) -> None:
        if self.observer is not None:
            self.observer.on_step(batch_size)
        self._num_steps += 1
        self._last_batch_size = batch_size
        self._max_batch_size = max(self._max_batch_size, batch_size)

    def _publish_stats(self) -> None:
        scheduler = self.engine.scheduler
        counters = self.engine.stats()
        with self._pending_lock:
            num_pending = self._num_pending
        self.stats = EngineStats(
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting),
            num_swapped=len(scheduler.swapped),
            num_pending=num_pending,
            num_blocks=scheduler.allocator.num_blocks,
            num_free_blocks=scheduler.allocator.num_free_blocks,
            num_steps=self._num_steps,
            last_step_batch_size=self._last_batch_size,
            max_step_batch_size=self._max_batch_size,
            prefix_cache_hit_rate=counters.prefix_cache_hit_rate if counters.prefix_cache_queried_tokens else None,
            num_queued_tokens=num_queued_tokens(scheduler),
        )


def num_queued_tokens(scheduler) -> int:
    """The work an engine holds, in tokens: for every running, waiting or swapped sequence, its prompt
    plus the output tokens it may still generate (up to ``max_tokens``; the engine admits no request
    beyond ``max_model_len``). Replicas report it so that routing prefers the least loaded engine."""
    return sum(seq.num_prompt_tokens + max(0, seq.params.max_tokens - seq.num_output_tokens)
               for seqs in (scheduler.running, scheduler.waiting, scheduler.swapped) for seq in seqs)


class _BatchSizeRecorder:
    """Wraps the engine's executor to see how many sequences each step carried."""

    def __init__(self, engine) -> None:
        self._inner = engine.executor
        self._last = 0
        engine.executor = self

    def execute(self, batch):
        self._last = batch.num_seqs
        return self._inner.execute(batch)

    def take(self) -> int:
        last, self._last = self._last, 0
        return last

    def __getattr__(self, name):
        return getattr(self._inner, name)
