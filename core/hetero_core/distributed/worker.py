"""A tensor-parallel worker: one rank > 0, in its own (spawned) process.

It joins the process group, builds its executor shard with the executor's own factory, then serves
rank 0's commands from its pipe, in order, until told to stop: ``("execute", (batch,))``,
``("copy_blocks" | "swap_out" | "swap_in", (pairs,))``, ``("shutdown", ())``. It answers each with
``("ok",)``; a command that raises is answered with ``("error", time, summary, traceback)`` and the
worker exits, which closes its sockets so that its peers' collectives fail at once. Rank 0 going
away (the pipe closes) stops it too: no worker outlives its engine.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
import traceback
from dataclasses import replace

import hetero_core.model  # noqa: F401  (OpenMP's wait policy, before torch loads)
from hetero_core.distributed import process_group

STARTED, READY, OK, ERROR = "started", "ready", "ok", "error"


def worker_main(rank: int, world_size: int, port: int, backend_name: str, factory, ctx, conn) -> None:
    """The process target (module-level, so the spawn context can pickle it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches every process; rank 0 stops us
    executor = None
    try:
        conn.send((STARTED,))
        process_group.init_group(process_group.join_store(port, world_size), rank, world_size, backend_name)
        executor = factory(replace(ctx, tensor_parallel_rank=rank))
        conn.send((READY,))
        serve(executor, conn)
    except BaseException as exc:  # noqa: BLE001 - every failure goes to rank 0, then the worker exits
        report_error(conn, exc)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # at once, closing the sockets its peers may be waiting on (no teardown that could block)
    process_group.destroy_group()


def serve(executor, conn) -> None:
    """Run rank 0's commands until ``shutdown`` or until rank 0 is gone."""
    while True:
        try:
            command, args = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # rank 0 exited
            executor.shutdown()
            return
        if command == "shutdown":
            executor.shutdown()
            conn.send((OK,))
            return
        getattr(executor, command)(*args)  # this rank's outputs are not needed: rank 0 has the same
        conn.send((OK,))


def report_error(conn, exc: BaseException) -> None:
    summary = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    try:
        conn.send((ERROR, time.time(), summary, traceback.format_exc()))
    except (OSError, ValueError):  # rank 0 is gone: nobody to tell
        pass
