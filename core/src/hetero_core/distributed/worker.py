"""A tensor-parallel worker: one rank > 0, in its own process, started by rank 0 as
``python -m hetero_core.distributed.worker FD`` (``worker_process.py``). It never runs the caller's
``__main__``: a script without an ``if __name__ == "__main__":`` guard, stdin or ``-c`` all work.

``FD`` is this end of a socket pair to rank 0 (a Ray actor runs the same loop, ``run``, over a TCP
connection to rank 0: ``ray_rank.py``). Down it come, in order: the setup (rank 0's ``sys.path``, this
rank, the world size, the rendezvous host and port and the backend), the executor's factory
and context (pickled by rank 0), then rank 0's commands, served in order until told to stop:
``("execute", (batch,))``, ``("copy_blocks" | "swap_out" | "swap_in", (pairs,))``, ``("shutdown", ())``.
Each is answered ``("ok",)`` (the last pipeline stage's first rank answers ``execute`` with
``("ok", output)``: it alone has the logits); anything that raises is answered
``("error", time, summary, traceback)`` and the worker exits at once, which closes its sockets so
that its peers' collectives fail at once.

Rank 0 stops the worker; the worker ignores SIGINT and SIGTERM (rank 0 handles them for the group)
and exits as soon as rank 0's end of the socket closes, whatever it is doing: no worker outlives its
engine, even one whose rank 0 was killed with SIGKILL.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
from dataclasses import replace
from multiprocessing.connection import Connection

from hetero_core.model.cpu.threads import choose_openmp_wait

STARTED, READY, OK, ERROR = "started", "ready", "ok", "error"
EXIT_FAILED = 1  # after reporting an exception to rank 0
EXIT_RANK0_GONE = 3  # rank 0's end of the socket closed before it said shutdown


def main(argv: list[str] | None = None) -> None:
    """The worker process: ``argv`` is ``[FD]``."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    argv = sys.argv[1:] if argv is None else argv
    run(Connection(int(argv[0])))


def run(conn: Connection, own_sys_path: bool = False) -> None:
    """Serve rank 0 down ``conn`` until it says shutdown; on any failure report it and exit the process.
    The same for a local worker process and a Ray actor (``ray_rank.py``). ``own_sys_path``: keep this
    interpreter's ``sys.path`` and only add rank 0's entries it lacks (another machine's interpreter,
    whose own installation of Hetero comes first); else take rank 0's whole (the same machine)."""
    watch_rank0(conn)
    executor = None
    try:
        setup = conn.recv()
        if own_sys_path:
            sys.path.extend(entry for entry in setup["sys_path"] if entry not in sys.path)
        else:
            sys.path[:] = setup["sys_path"]  # rank 0's: the factory's module imports as it did there
        factory, ctx = pickle.loads(conn.recv_bytes())
        choose_openmp_wait(getattr(ctx.options, "device", "cpu"))  # before process_group loads torch
        from hetero_core.distributed import process_group

        conn.send((STARTED,))
        rank, world_size = setup["rank"], setup["world_size"]
        store = process_group.join_store(setup["host"], setup["port"], world_size)
        process_group.init_group(store, rank, world_size, setup["backend"])
        executor = factory(replace(ctx, **setup["ranks"]))
        conn.send((READY,))
        serve(executor, conn, setup["returns_output"])
    except BaseException as exc:  # noqa: BLE001 - every failure goes to rank 0, then the worker exits
        report_error(conn, exc)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(
            EXIT_FAILED
        )  # at once, closing the sockets its peers may be waiting on (no teardown that could block)
    process_group.destroy_group()


def watch_rank0(conn: Connection) -> None:
    """Exit the moment rank 0's end of ``conn`` closes (rank 0 exited or was killed), even while the
    main thread is blocked in a collective or a slow load. Polls for the hang-up only: it never
    reads, so the commands stay the main thread's."""
    hang_up = getattr(select, "POLLRDHUP", 0)  # Linux; elsewhere POLLHUP alone says it

    def watch() -> None:
        poller = select.poll()
        poller.register(conn.fileno(), hang_up)  # never POLLIN: hang-ups and errors are always reported
        while True:
            for _, events in poller.poll():
                if events & (hang_up | select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    os._exit(EXIT_RANK0_GONE)

    threading.Thread(target=watch, name="hetero-tp-watch-rank0", daemon=True).start()


def serve(executor, conn, returns_output: bool = False) -> None:
    """Run rank 0's commands until ``shutdown``. ``returns_output``: this rank (the last pipeline
    stage's first) answers ``execute`` with ``("ok", output)``, pickled whole (plain pickle: the
    tensors' bytes travel in the message, not as shared memory); other ranks' outputs are not needed
    (rank 0 has the same, or, in an earlier stage, none)."""
    while True:
        command, args = pickle.loads(conn.recv_bytes())
        if command == "shutdown":
            executor.shutdown()
            conn.send((OK,))
            return
        result = getattr(executor, command)(*args)
        if returns_output and command == "execute":
            conn.send_bytes(pickle.dumps((OK, result), protocol=pickle.HIGHEST_PROTOCOL))
        else:
            conn.send((OK,))


def report_error(conn, exc: BaseException) -> None:
    summary = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    try:
        conn.send((ERROR, time.time(), summary, traceback.format_exc()))
    except (OSError, ValueError):  # rank 0 is gone: nobody to tell
        pass


if __name__ == "__main__":  # run as ``python -m``: take main from the package's module, not this copy
    from hetero_core.distributed.worker import main as package_main

    package_main()
