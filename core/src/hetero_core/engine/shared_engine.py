"""SharedEngine: one Engine run for the generate calls of several threads (what makes ``LLM`` thread-safe).

A call queues all its requests (each checked before any is queued) and waits for them. Whichever
calling thread holds the lock steps the engine for everyone and hands each output to the call that
owns it: requests from different threads join the same batches, and every output reaches its own
caller. The lock is first come, first served, so a thread that arrives while another steps joins
before that one's next step. While calls run, the engine is claimed for them
(``ThreadGuard.acting_for``): a thread that drives ``llm.engine`` directly meanwhile gets
``ConcurrentEngineUseError`` instead of taking other
callers' outputs. A call that ends early (an exception in its thread, such as KeyboardInterrupt)
aborts its unfinished requests, and their final outputs are collected: nothing stays in the engine.
"""

from __future__ import annotations

import threading
from collections import deque

from hetero_core.engine.engine import Engine
from hetero_core.engine.requests.outputs import RequestOutput
from hetero_core.logging import get_logger

__all__ = ["SharedEngine"]
log = get_logger("hetero.llm")


class _Call:
    """One generate call: its request ids in order and the final outputs received so far."""

    def __init__(self, request_ids: list[str]) -> None:
        self.request_ids = request_ids
        self.finished: dict[str, RequestOutput] = {}

    @property
    def is_done(self) -> bool:
        return len(self.finished) == len(self.request_ids)


class FairLock:
    """A lock handed over in the order it was asked for (``threading.Lock`` promises no order).

    A waiter interrupted (KeyboardInterrupt) leaves the queue, or passes the lock on if it was
    already handed to it: nobody waits for a thread that is gone.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._is_held = False
        self._waiters: deque[threading.Lock] = deque()

    def __enter__(self) -> None:
        with self._mutex:
            if not self._is_held:
                self._is_held = True
                return
            waiter = threading.Lock()
            waiter.acquire()
            self._waiters.append(waiter)
        try:
            waiter.acquire()  # released by the holder: the lock is ours
        except BaseException:
            with self._mutex:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                    raise
            self.__exit__()  # it was handed to us meanwhile: hand it on
            raise

    def __exit__(self, *exc_info) -> None:
        with self._mutex:
            if self._waiters:
                self._waiters.popleft().release()  # still held: now by the first waiter
            else:
                self._is_held = False

    @property
    def num_waiting(self) -> int:
        """Threads waiting for the lock."""
        return len(self._waiters)


class SharedEngine:
    name = "LLM.generate / chat (running in other threads)"  # how the engine's guard names the claimant

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = FairLock()
        self._owners: dict[str, _Call] = {}  # request id -> the call waiting for it
        self._abandoned: set[str] = set()  # aborted by a call that left; their outputs are dropped
        self._num_calls = 0

    @property
    def num_waiting(self) -> int:
        """Calling threads waiting for their turn to join or to step."""
        return self._lock.num_waiting

    def run(self, prompts: list, params: list, on_finished=None) -> list[RequestOutput]:
        """Run the prompts to completion, stepping for every call meanwhile; outputs in prompt order.
        ``on_finished(outputs)``, called in this thread, gets this call's outputs as they finish."""
        call = self._join(prompts, params)
        num_reported = 0
        try:
            while True:
                with self._lock:
                    if on_finished is not None and len(call.finished) > num_reported:
                        on_finished(list(call.finished.values())[num_reported:])
                        num_reported = len(call.finished)
                    if call.is_done:
                        return [call.finished[i] for i in call.request_ids]
                    self._step(call)
        finally:
            with self._lock:
                self._leave(call)

    def shutdown(self) -> None:
        """Abort what still runs (its callers get the aborted outputs), then release the executor."""
        with self._lock, self.engine.guard.acting_for(self):
            for request_id in list(self._owners):
                self.engine.abort(request_id)
            if self._owners:
                self._step(None)  # the aborted outputs reach their callers
            self.engine.shutdown()

    # -- under the lock ----------------------------------------------------------------------------
    def _join(self, prompts: list, params: list) -> _Call:
        with self._lock, self.engine.guard.acting_for(self):
            if self._num_calls == 0:
                self.engine.guard.enter()  # claim the engine for the calls (refused if a thread is inside)
            try:
                call = _Call(self.engine.add_requests(prompts, params, stream=False))  # final outputs only
            except BaseException:
                self._release_if_idle()
                raise
            self._num_calls += 1
            self._owners.update((i, call) for i in call.request_ids)
            return call

    def _leave(self, call: _Call) -> None:
        with self.engine.guard.acting_for(self):
            try:
                unfinished = [i for i in call.request_ids if i not in call.finished]
                for request_id in unfinished:
                    self._owners.pop(request_id, None)
                    self.engine.abort(request_id)
                self._drop([i for i in unfinished if self.engine.has_request(i)])
            finally:
                self._num_calls -= 1
                self._release_if_idle()

    def _drop(self, request_ids: list[str]) -> None:
        """Collect and drop the final outputs of requests a leaving call aborted."""
        if not request_ids:
            return
        self._abandoned.update(request_ids)
        try:
            self._step(None)  # an abort's output comes with the next step; nothing is left behind
        except Exception as exc:  # the engine itself fails: the outputs go with the next step that works
            log.warning("llm.abort_flush_failed", request_ids=request_ids, error=repr(exc))

    def _step(self, call: _Call | None) -> None:
        with self.engine.guard.acting_for(self):
            outputs = self.engine.step()
            others = []
            for out in outputs:
                owner = self._owners.get(out.request_id)
                if owner is not None:
                    if out.finished:
                        owner.finished[out.request_id] = out
                        del self._owners[out.request_id]
                elif out.request_id in self._abandoned:
                    if out.finished:
                        self._abandoned.discard(out.request_id)
                else:  # a request added with engine.add_request: its caller's next step() gets it
                    others.append(out)
            if others:
                self.engine.hold_outputs(others)
            if call is not None and not call.is_done and not self.engine.has_unfinished_requests():
                lost = [
                    i for i in call.request_ids if i not in call.finished and not self.engine.has_request(i)
                ]
                if lost:
                    raise RuntimeError(f"engine bug: requests {lost} ended without a final output")

    def _release_if_idle(self) -> None:
        if self._num_calls == 0:
            with self.engine.guard.acting_for(self):
                self.engine.guard.exit()
