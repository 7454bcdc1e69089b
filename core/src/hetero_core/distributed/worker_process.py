"""One tensor-parallel worker process, as rank 0 sees it, and the launcher of the ``mp`` backend
(``LocalProcessLauncher``: a process per rank on this machine).

A worker is a fresh interpreter, ``python -m hetero_core.distributed.worker FD`` (never a fork of
rank 0, never a re-run of the caller's ``__main__``), in a session of its own, so that Ctrl-C in a
terminal or a signal to rank 0's process group reaches rank 0 only, which stops the workers in order.
It talks to rank 0 through a socket pair (``conn``): when the worker exits, ``conn`` reads as closed,
which is how rank 0 notices a death; when rank 0 exits, the worker notices the same way and exits.
Its stderr passes through to rank 0's, and its last line is kept for the error that says how the
worker ended.
"""

from __future__ import annotations

import io
import os
import pickle
import socket
import subprocess
import sys
import threading
import types
from multiprocessing.connection import Connection
from pathlib import Path

from hetero_core.distributed.failures import WorkerReport
from hetero_core.errors import ConfigError

WORKER_MODULE = "hetero_core.distributed.worker"
MAX_LINE_CHARS = 300  # of the last stderr line quoted in an error
STDERR_DRAIN_S = 2.0  # after a worker exited: how long its last stderr lines may take to arrive


class LocalProcessLauncher:
    """The ``mp`` backend: every worker a process on this machine; the rendezvous on the loopback."""

    rendezvous_host = "127.0.0.1"
    where = None

    def start(self, world_size: int) -> list[WorkerProcess]:
        workers: list[WorkerProcess] = []
        try:
            for rank in range(1, world_size):
                workers.append(WorkerProcess(rank))
        except BaseException:
            for worker in workers:
                worker.kill()
                worker.close()
            raise
        return workers

    def node_ids(self) -> list[str | None]:
        return []

    def close(self) -> None:
        pass


class WorkerProcess:
    """Rank ``rank``'s process, started at construction; ``send_setup`` then gives it its work."""

    where = None  # this machine

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.error_message: tuple | None = None  # an error report received while waiting for something else
        self.last_stderr_line: str | None = None
        ours, theirs = socket.socketpair()
        try:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=worker_environment(),
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self._stderr = threading.Thread(
            target=self._pass_stderr, name=f"hetero-tp-rank{rank}-stderr", daemon=True
        )
        self._stderr.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def exitcode(self) -> int | None:
        """None while running; negative: killed by that signal (as ``multiprocessing``)."""
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def send_setup(self, setup: dict, payload: bytes) -> None:
        """The worker's setup (builtins only) and the pickled ``(factory, ctx)``."""
        self.conn.send(setup)
        self.conn.send_bytes(payload)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the process to exit; True when it has."""
        try:
            self.popen.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return False
        self._stderr.join(timeout=STDERR_DRAIN_S)  # its last words, for the error
        return True

    def record_end(self, report: WorkerReport) -> None:
        """Its exit code (negative: the signal that killed it) and its last stderr line."""
        report.exitcode, report.last_stderr_line = self.exitcode, self.last_stderr_line

    def kill(self) -> None:
        if self.is_alive():
            self.popen.kill()
        self.popen.wait()
        self._stderr.join(timeout=STDERR_DRAIN_S)

    def close(self) -> None:
        self.conn.close()

    def _pass_stderr(self) -> None:
        for raw in self.popen.stderr:
            line = raw.decode(errors="replace")
            if line.strip():
                self.last_stderr_line = line.strip()[:MAX_LINE_CHARS]
            try:
                sys.stderr.write(line)
                sys.stderr.flush()
            except (OSError, ValueError, AttributeError):  # no stderr to pass it to: keep only the last line
                pass
        self.popen.stderr.close()


def worker_environment() -> dict[str, str]:
    """This environment, with the ``hetero_core`` rank 0 runs first on ``PYTHONPATH`` so that
    ``python -m`` finds the same one (the worker then takes rank 0's whole ``sys.path``)."""
    root = str(Path(__file__).resolve().parents[2])  # the folder holding this hetero_core package
    rest = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + rest if rest else "")}


def pickle_for_workers(factory, ctx, executor_name: str) -> bytes:
    """``(factory, ctx)`` as the workers unpickle them; a ConfigError in one line when they cannot:
    something unpicklable, or defined in ``__main__`` (the caller's script, which workers do not run)."""
    buffer = io.BytesIO()
    try:
        _WorkerPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump((factory, ctx))
    except _DefinedInMain as exc:
        raise ConfigError(
            f"executor '{executor_name}' cannot start tensor-parallel workers: {exc.name} is "
            "defined in __main__ (the script being run), which the workers do not run; "
            "define it in a module they can import"
        ) from None
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise ConfigError(
            f"executor '{executor_name}' cannot start tensor-parallel workers: its factory or "
            f"context cannot be sent to another process ({exc})"
        ) from None
    return buffer.getvalue()


class _DefinedInMain(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class _WorkerPickler(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__":
            raise _DefinedInMain(getattr(obj, "__qualname__", repr(obj)))
        return NotImplemented
