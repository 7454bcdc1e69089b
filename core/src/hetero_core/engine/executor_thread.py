"""ExecutorThread: the executor on its own thread, for async scheduling.

Steps run in the order they are submitted, each as its block transfers (swap out, swap in, copies)
then its batch, so a block the engine frees while a step runs is reused only by a later step. The
engine thread plans step N+1 while the executor runs step N. ``submit`` returns once the thread has
taken the step: the engine thread hands it the interpreter lock at that moment, so a step starts at
once instead of waiting for the engine thread's next pause (Python switches threads only every few
milliseconds otherwise). A step's executor is the one the engine held when it was submitted.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

from hetero_core.engine.kv.block_transfer import apply_block_transfers

__all__ = ["ExecutorThread"]


class ExecutorThread:
    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hetero-executor")

    def submit(self, executor, step) -> Future:
        """Run ``step`` (a ``ScheduledStep``) on the thread; the future holds the executor's output
        (None for a step with transfers only) or what it raised."""
        started = threading.Event()
        future = self._pool.submit(_run, executor, step, started)
        started.wait()
        return future

    def shutdown(self) -> None:
        """Wait for the steps submitted, then end the thread."""
        self._pool.shutdown(wait=True)


def _run(executor, step, started: threading.Event):
    started.set()
    apply_block_transfers(executor, step)
    return executor.execute(step.batch) if step.batch is not None else None
