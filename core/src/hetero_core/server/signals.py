"""How ``hetero serve`` is stopped: SIGTERM is Ctrl-C (SIGINT).

In every server mode (one engine, tensor-parallel, replicas on Ray Serve) both signals raise
``KeyboardInterrupt`` in the main thread and stop the server the same way: no new connections,
running requests get ``graceful_shutdown_seconds`` to finish, the rest are aborted, the engine and
its workers (or the Ray Serve application and a Ray instance started here) are stopped, and
``hetero serve`` exits 130 ("interrupted"). Child processes are ours to stop: tensor-parallel workers
run in a session of their own, and Ray's processes start with both signals blocked
(``signals_blocked_in_children``), so a signal sent to the whole process group (``kill -TERM -PGID``,
``timeout``, a terminal's Ctrl-C) or to every process of a service reaches the server only.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Inside: SIGTERM raises ``KeyboardInterrupt`` in the main thread, as SIGINT does (its handler
    before is restored on the way out). Nothing changes when called from another thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def take_back_sigterm() -> None:
    """Make SIGTERM interrupt again after a library replaced its handler (``ray.init`` installs one
    that calls ``sys.exit``), inside ``sigterm_interrupts``; nothing changes off the main thread."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.default_int_handler)


@contextmanager
def signals_blocked_in_children() -> Iterator[None]:
    """Processes this thread starts inside (and the processes they start) begin with SIGINT and
    SIGTERM blocked, so that only their parent's explicit stop ends them. A signal to this process is
    not lost: another thread takes it, or it waits for the block to end; either way its handler
    runs in the main thread.)"""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
