"""ThreadGuard: the Engine is single-threaded; a second thread entering it while one is inside is an error.

The engine's methods that change its state (``add_request``, ``add_requests``, ``abort``, ``step``,
``generate``, ``hold_outputs``, ``shutdown``) run inside the guard. The thread inside may re-enter
(``generate`` calls ``step``); any other thread that enters meanwhile gets
``ConcurrentEngineUseError`` at once, before it touches anything, and the thread inside goes on
undisturbed. Calls from different threads one after another are fine (AsyncLLM builds an engine on
one thread and steps it on another).

A claimant (``LLM``'s ``SharedEngine``) can hold the guard across calls and act through any thread
(``acting_for``): while it holds it, the threads it serializes count as one owner and every other
thread is refused.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from hetero_core.errors import HeteroError

__all__ = ["ConcurrentEngineUseError", "ThreadGuard"]


class ConcurrentEngineUseError(HeteroError):
    """A second thread called into an Engine while another thread was inside it."""


class ThreadGuard:
    """A non-blocking, re-entrant claim on an object by one thread (or one claimant) at a time."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._lock = threading.Lock()
        self._owner: object = None
        self._depth = 0
        self._local = threading.local()

    def enter(self) -> None:
        me = self._me()
        if self._owner is me:  # only this owner ever sets the owner to itself
            self._depth += 1
            return
        if not self._lock.acquire(blocking=False):
            raise ConcurrentEngineUseError(
                f"{self._what} is single-threaded: thread {threading.current_thread().name!r} called it "
                "while "
                f"{_describe(self._owner)} was inside it; share an engine between threads through LLM "
                "(generate and chat are safe from several threads) or AsyncLLM, or give each thread its own"
            )
        self._owner, self._depth = me, 1

    def exit(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            self._lock.release()

    __enter__ = enter

    def __exit__(self, *exc_info) -> None:
        self.exit()

    @contextmanager
    def acting_for(self, claimant: object) -> Iterator[None]:
        """Within this block, this thread enters the guard as ``claimant`` (one owner for all its threads)."""
        previous = getattr(self._local, "claimant", None)
        self._local.claimant = claimant
        try:
            yield
        finally:
            self._local.claimant = previous

    def _me(self) -> object:
        return getattr(self._local, "claimant", None) or threading.current_thread()


def _describe(owner: object) -> str:
    if owner is None:  # it left just now
        return "another thread"
    if isinstance(owner, threading.Thread):
        return f"thread {owner.name!r}"
    return str(getattr(owner, "name", owner))
