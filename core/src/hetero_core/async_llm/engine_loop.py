"""EngineLoop: the one thread that touches an AsyncLLM's engine.

Commands arrive on a thread-safe queue (``add`` a tokenized request, ``abort``, ``stop``) and are
applied between steps, so requests that arrive together join the same batches. The loop admits only
requests that callers have already checked and tokenized (``EngineRequest``): nothing it does for a
request grows with what the caller sent. Every request it accepted ends with exactly one final item
on its stream: the last delta (``finished``; ``finish_reason`` "abort" for an aborted one) or an error.

A step that raises fails the requests it was running (``EngineStepError``) and the loop keeps
serving the others; if the engine cannot even abort them, or the executor is dead
(``ExecutorDeadError``), the engine is marked dead and every request fails with ``EngineDeadError``.

The loop reads only the engine's public methods: ``engine.stats()`` after every step (queues, blocks,
the step's batch size, queued tokens) is what it publishes as ``EngineStats``.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

from hetero_core.async_llm.errors import EngineDeadError, EngineStepError, RequestFailedError
from hetero_core.async_llm.request_stream import RequestStream
from hetero_core.engine.requests.outputs import RequestOutput
from hetero_core.errors import ExecutorDeadError, InvalidRequestError
from hetero_core.logging import get_logger

__all__ = ["EngineLoop", "EngineStats"]
log = get_logger("hetero.async_llm")
IDLE_STEP_WAIT_S = 0.002


@dataclass(frozen=True)
class EngineStats:
    """A snapshot the loop thread publishes after every step (safe to read from any thread)."""

    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    num_pending: int = 0  # requests holding an AsyncLLM slot (accepted, their stream not closed yet)
    num_blocks: int = 0
    num_free_blocks: int = 0
    num_steps: int = 0
    last_step_batch_size: int = 0
    max_step_batch_size: int = 0
    prefix_cache_hit_rate: float | None = None  # once a request was looked up in the prefix cache
    # The work the engine holds, in tokens: for every unfinished request, its prompt plus the output
    # tokens it may still generate (up to max_tokens). Replicas report it so that routing prefers the
    # least loaded engine.
    num_queued_tokens: int = 0
    # speculative decoding, counters since the start (engine.stats(); 0 while it is off)
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0


class EngineLoop:
    def __init__(self, engine, *, observer=None) -> None:
        self.engine = engine
        self.observer = observer  # optional: on_step(batch_size), on_output(output, num_new_tokens)
        counters = engine.stats()
        self.stats = EngineStats(num_blocks=counters.num_blocks, num_free_blocks=counters.num_free_blocks)
        self.dead_reason: str | None = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._requests: dict[str, RequestStream] = {}  # loop thread only
        self._num_steps = self._last_batch_size = self._max_batch_size = 0
        self._flush_needed = False
        self._idle_step = False
        self._closed = False  # set by the loop thread when it exits
        self._submit_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="hetero-engine-loop", daemon=True)
        self._thread.start()

    # -- any thread --------------------------------------------------------------------------------
    def add(self, stream: RequestStream) -> None:
        """Queue a started stream's request; EngineDeadError once the loop has exited."""
        with self._submit_lock:
            if self._closed:  # nobody would answer
                raise EngineDeadError(f"the engine is not running: {self.dead_reason or 'shut down'}")
            self._commands.put(("add", stream))

    def abort(self, request_id: str) -> None:
        with self._submit_lock:
            if not self._closed:
                self._commands.put(("abort", request_id))

    def stop(self, timeout: float) -> bool:
        """Fail pending requests as aborted and stop the thread; True once it has exited."""
        if self._thread.is_alive():
            self._commands.put(("stop", None))
            self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and self.dead_reason is None

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
                counters = None
                if (self._requests or self._flush_needed) and not stopping:
                    counters = self._step()
                self._publish_stats(counters or self.engine.stats())
            except Exception as exc:  # a bug in this loop: say so and fail everyone, never hang
                self.dead_reason = f"engine loop failed: {type(exc).__name__}: {exc}"
                log.error("engine.dead", reason=self.dead_reason)
                stopping = True
        with self._submit_lock:  # after this, add() refuses at once instead of queueing
            self._closed = True
        self._fail_all(lambda: EngineDeadError("the engine was shut down; the request was aborted"))
        self.dead_reason = self.dead_reason or "shut down"
        while True:  # requests queued before the close get an answer too
            try:
                kind, value = self._commands.get_nowait()
            except queue.Empty:
                break
            if kind == "add":
                value.send(EngineDeadError("the engine was shut down before the request started"))

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

    def _add(self, stream: RequestStream) -> None:
        if self.dead_reason is not None:
            return stream.send(EngineDeadError(f"the engine is not running: {self.dead_reason}"))
        try:
            self.engine.add_request(stream.request, request_id=stream.request_id)
        except InvalidRequestError as exc:
            return stream.send(InvalidRequestError(str(exc)))
        except Exception as exc:  # an engine bug must not take the loop down
            log.error("request.add_failed", request_id=stream.request_id, error=repr(exc))
            return stream.send(RequestFailedError(f"could not add the request: {exc!r}"))
        self._requests[stream.request_id] = stream
        if stream.abort_requested:  # aborted before it got here
            self._abort(stream.request_id)

    def _abort(self, request_id: str) -> None:
        """The request stays until its final (aborted) output, which comes with the next step, is sent."""
        if request_id in self._requests:
            self.engine.abort(request_id)
            self._flush_needed = True

    def _step(self):
        """One engine step; the engine's stats after it (None if it raised)."""
        self._flush_needed = False
        running_before = self.engine.running_request_ids()
        try:
            outputs = self.engine.step()
        except Exception as exc:  # fail what the step touched; keep serving the rest
            return self._recover(exc, running_before)
        counters = self.engine.stats()
        batch_size = counters.last_step_num_seqs
        if batch_size:
            self._record_step(batch_size)
        self._idle_step = not batch_size and not outputs
        for out in outputs:
            stream = self._requests.get(out.request_id)
            if stream is not None:
                self._deliver(stream, out)
            elif self.observer is not None:
                self.observer.on_output(out, 0)
        if not outputs and self._requests and not self.engine.has_unfinished_requests():
            self._fail_all(lambda: RequestFailedError("the engine lost track of the request"))
        return counters

    def _deliver(self, stream: RequestStream, out: RequestOutput) -> None:
        if self.observer is not None:
            self.observer.on_output(out, len(out.output_token_ids) - stream.num_sent_tokens)
        if out.finished:
            self._requests.pop(stream.request_id, None)
        if out.error is not None:
            self._requests.pop(stream.request_id, None)
            stream.send(RequestFailedError(out.error))
        elif not stream.send(stream.delta(out, self.engine.tokenizer)) and not out.finished:
            self._abort(stream.request_id)  # the caller's event loop is gone: nobody is listening

    def _recover(self, exc: Exception, running_before: list[str]) -> None:
        reason = f"engine step failed: {type(exc).__name__}: {exc}"
        log.error("engine.step_failed", error=reason)
        if isinstance(exc, ExecutorDeadError):  # nothing can run any more: every request fails with it
            return self._die(str(exc))
        affected = set(running_before).union(self.engine.running_request_ids()) & set(self._requests)
        affected = affected or set(self._requests)
        try:
            for request_id in affected:
                self.engine.abort(request_id)
        except Exception as abort_exc:
            return self._die(f"{reason}; then abort failed: {abort_exc!r}")
        for request_id in affected:
            self._requests.pop(request_id).send(EngineStepError(reason))

    def _die(self, reason: str) -> None:
        self.dead_reason = reason
        log.error("engine.dead", reason=reason)
        self._fail_all(lambda: EngineDeadError(f"the engine stopped: {reason}"))

    def _fail_all(self, make_error) -> None:
        requests, self._requests = self._requests, {}
        for stream in requests.values():
            stream.send(make_error())

    def _record_step(self, batch_size: int) -> None:
        if self.observer is not None:
            self.observer.on_step(batch_size)
        self._num_steps += 1
        self._last_batch_size = batch_size
        self._max_batch_size = max(self._max_batch_size, batch_size)

    def _publish_stats(self, counters) -> None:
        self.stats = EngineStats(
            num_running=counters.num_running,
            num_waiting=counters.num_waiting,
            num_swapped=counters.num_swapped,
            num_blocks=counters.num_blocks,
            num_free_blocks=counters.num_free_blocks,
            num_steps=self._num_steps,
            last_step_batch_size=self._last_batch_size,
            max_step_batch_size=self._max_batch_size,
            prefix_cache_hit_rate=counters.prefix_cache_hit_rate
            if counters.prefix_cache_queried_tokens
            else None,
            num_queued_tokens=counters.num_queued_tokens,
            spec_num_drafts=counters.spec_num_drafts,
            spec_num_draft_tokens=counters.spec_num_draft_tokens,
            spec_num_accepted_tokens=counters.spec_num_accepted_tokens,
        )
