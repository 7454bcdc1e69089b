"""The executor a tensor- or pipeline-parallel engine sees: rank 0 here, ranks 1..size-1 in worker
processes, local or Ray actors on a cluster, as its launcher starts them (``worker_launcher.py``;
``size = tensor_parallel_size * pipeline_parallel_size``; global rank ``r`` is stage
``r // tensor_parallel_size``, tensor-parallel rank ``r % tensor_parallel_size``).

The scheduler and the KV bookkeeping run once, in the engine's process. Each step rank 0 sends the
same ``Batch`` to every worker (pickled once, down one socket per worker), runs its own shard, and
waits for every worker's answer; all ranks meet in the model's collectives, and the gathered logits
of rank 0 are the step's output; with pipeline stages, the last stage's first rank computes the
logits and sends its ``ExecutorOutput`` back with its answer (rank 0, in the first stage, has no LM
head). Block copies and swaps go to every rank the same way, since each rank owns its share of the
KV heads, or its stage's layers. Its declaration (``capabilities``) is rank 0's executor's, less
KV export and import (a rank holds only its share of the heads: a handoff would miss the rest).
Workers are ``python -m`` processes (``worker_process.py``) or Ray actors (``ray_launcher.py``), both
running ``worker.run``.

Any failure (a worker's exception, a worker that exits or is killed, a collective timing out) stops
the group: the workers are stopped and this and every later call raises ``ExecutorDeadError`` with
one line naming the rank and how it ended (its exception; or its exit code or signal, with its last
stderr line), which the engine lets through. A failure while the workers start raises the same
error from the constructor. ``shutdown()`` stops the workers.
"""

from __future__ import annotations

import atexit
import pickle
import sys
import time
import weakref
from collections import deque
from dataclasses import replace
from multiprocessing.connection import wait

from hetero_core.distributed import process_group
from hetero_core.distributed.failures import WorkerReport, blame, describe_failure
from hetero_core.distributed.worker import ERROR, OK, READY, STARTED
from hetero_core.distributed.worker_launcher import RankWorker, WorkerLauncher
from hetero_core.distributed.worker_process import LocalProcessLauncher, pickle_for_workers
from hetero_core.engine.executor_capabilities import check_capabilities
from hetero_core.engine.scheduling.batch import Batch, ExecutorOutput
from hetero_core.errors import ConfigError, ExecutorDeadError, HeteroError
from hetero_core.logging import get_logger

log = get_logger("hetero.tensor_parallel")
FAILURE_GRACE_S = 5.0  # after a failure: how long the workers get to report or exit
STOP_GRACE_S = 10.0  # at shutdown: how long a worker gets to finish before it is killed
_LIVE: weakref.WeakSet = weakref.WeakSet()  # executors not shut down yet (stopped at interpreter exit)


class TensorParallelExecutor:
    """``factory(ctx)`` builds one rank's executor (the executor's own factory, picklable:
    a module-level function); ``ctx.tensor_parallel_size * ctx.pipeline_parallel_size`` ranks in all,
    the workers started by ``launcher`` (local processes by default)."""

    def __init__(self, factory, ctx, executor_name: str, launcher: WorkerLauncher | None = None):
        self.tensor_parallel_size = ctx.tensor_parallel_size
        self.pipeline_parallel_size = ctx.pipeline_parallel_size
        self.size = ctx.tensor_parallel_size * ctx.pipeline_parallel_size
        # the rank whose step output is the engine's: rank 0, or the last stage's first rank
        self.output_rank = (self.pipeline_parallel_size - 1) * self.tensor_parallel_size
        self.executor_name = executor_name
        self.dead_reason: str | None = None
        self.rendezvous_host: str | None = None  # where rank 0's store listens (once the workers start)
        self._launcher = launcher or LocalProcessLauncher()
        self._workers: list[RankWorker] = []
        self._closed = False
        self.local = None
        self._in_flight = 0  # steps started (``start_step``) whose answers are not read yet
        self._done: deque[ExecutorOutput] = deque()  # outputs read early (before a block transfer)
        if process_group.dist.is_initialized():
            raise ConfigError(
                "a torch.distributed process group already exists in this process (another "
                "tensor-parallel engine, or torchrun); shut it down before starting one"
            )
        payload = pickle_for_workers(factory, ctx, executor_name)  # before any process starts
        try:
            self._start(payload, factory, ctx)
        except _WorkerGone as exc:
            error = self._fail(exc, "the engine did not start")
            process_group.destroy_group()
            raise error from None
        except BaseException:
            self._stop_workers(graceful=False)
            process_group.destroy_group()
            raise
        _LIVE.add(self)

    def _start(self, payload: bytes, factory, ctx) -> None:
        backend = process_group.backend()
        self._workers = self._launcher.start(self.size)  # they wait for their setup
        self.rendezvous_host = host = self._launcher.rendezvous_host  # known once they are placed
        store = process_group.host_store(self.size, host)
        for worker in self._workers:
            setup = {
                "sys_path": list(sys.path),
                "rank": worker.rank,
                "world_size": self.size,
                "host": host,
                "port": store.port,
                "backend": backend,
                "ranks": self._ranks(worker.rank),
                "returns_output": worker.rank == self.output_rank,
            }
            try:
                worker.send_setup(setup, payload)
            except OSError:  # it exited already: _fail says how
                raise _WorkerGone() from None
        self._wait_for(STARTED, process_group.START_TIMEOUT.total_seconds(), "starting")
        process_group.init_group(store, 0, self.size, backend)
        self.local = factory(replace(ctx, **self._ranks(0)))
        # what the rank executors can do (copies and swaps run on every rank), without KV transfer
        local = check_capabilities(self.local, self.executor_name)
        # with stages: two steps in flight (``start_step`` / ``finish_step``)
        pipelined = self.pipeline_parallel_size > 1
        self.capabilities = replace(local, kv_export=False, kv_import=False, pipelined_steps=pipelined)
        self._wait_for(READY, process_group.START_TIMEOUT.total_seconds(), "loading its shard")
        log.info(
            "tensor_parallel.ready",
            size=self.size,
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            backend=backend,
            executor=self.executor_name,
            workers=self.worker_pids,
            nodes=self.worker_nodes or None,
            rendezvous=f"{host}:{store.port}",
        )

    @property
    def kind(self) -> str:
        return "tensor-parallel" if self.pipeline_parallel_size == 1 else "pipeline-parallel"

    def _worker_name(self, rank: int) -> str:
        """How errors name a worker: ``tensor-parallel worker rank 1``, or with pipeline stages
        ``pipeline-parallel worker rank 1 (stage 1)``; a Ray actor's with its node (``... on node
        10.0.0.5 (1a2b3c4d)``)."""
        if self.pipeline_parallel_size == 1:
            name = f"tensor-parallel worker rank {rank}"
        else:
            name = f"pipeline-parallel worker rank {rank} (stage {rank // self.tensor_parallel_size})"
        where = self._workers[rank - 1].where if 0 < rank <= len(self._workers) else None
        return f"{name} {where}" if where else name

    def _ranks(self, rank: int) -> dict[str, int]:
        """Global ``rank``'s place in the ``ExecutorContext``."""
        return {
            "tensor_parallel_rank": rank % self.tensor_parallel_size,
            "pipeline_parallel_rank": rank // self.tensor_parallel_size,
        }

    # -- the executor -----------------------------------------------------------------------------
    def execute(self, batch: Batch) -> ExecutorOutput:
        return self._everywhere("execute", batch)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        self._everywhere("copy_blocks", pairs)

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        self._everywhere("swap_out", pairs)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        self._everywhere("swap_in", pairs)

    def start_step(self, batch: Batch) -> None:
        """Start a step (pipeline stages only): every rank gets ``batch`` and rank 0 runs its stage,
        whose activations go on to the next; it returns while the later stages work, so rank 0 can
        start the next step (of other sequences) at once. ``finish_step`` gives the outputs in order."""

        def start():
            self._send("execute", (batch,))
            self.local.execute(batch)  # the first stage's: no logits (the last stage's answer has them)
            self._in_flight += 1

        self._guarded(start)

    def finish_step(self) -> ExecutorOutput:
        """The output of the oldest step started and not finished (waiting for its last stage)."""

        def finish():
            if self._done:
                return self._done.popleft()
            self._in_flight -= 1
            return self._answers("execute")

        return self._guarded(finish)

    def shutdown(self) -> None:
        """Stop the workers and release rank 0's shard; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        if self.dead_reason is None:
            for worker in self._workers:
                try:
                    worker.conn.send_bytes(pickle.dumps(("shutdown", ())))
                except OSError:
                    pass
        self._stop_workers()
        if self.local is not None:
            self.local.shutdown()
        process_group.destroy_group()

    @property
    def worker_pids(self) -> list[int]:
        return [w.pid for w in self._workers]

    @property
    def worker_nodes(self) -> list[str]:
        """Each rank's Ray node id, rank 0's first (empty for local processes)."""
        return self._launcher.node_ids()

    def __getattr__(self, name):
        """Everything else (``vocab_size``, ``eos_token_id``, ``model``, ...) is rank 0's."""
        local = self.__dict__.get("local")
        if local is None or name.startswith("_"):
            raise AttributeError(name)
        return getattr(local, name)

    # -- one command on every rank ----------------------------------------------------------------
    def _everywhere(self, command: str, *args):
        def run():
            while self._in_flight:  # the answers of steps started earlier come first: read them
                self._in_flight -= 1
                self._done.append(self._answers("execute"))
            self._send(command, args)
            result = getattr(self.local, command)(*args)
            output = self._answers(command)
            return result if output is None else output

        return self._guarded(run)

    def _guarded(self, work):
        """``work()``, or the group's one-line error: any failure stops the group."""
        if self.dead_reason is not None:
            raise ExecutorDeadError(self.dead_reason)
        if self._closed:
            raise ExecutorDeadError(f"the {self.kind} executor was shut down")
        try:
            return work()
        except ExecutorDeadError:
            raise
        except Exception as exc:  # noqa: BLE001 - ranks may now disagree: the group cannot go on
            raise self._fail(exc, "the engine has stopped") from None

    def _send(self, command: str, args: tuple) -> None:
        self._check_workers_alive()
        payload = pickle.dumps((command, args))
        for worker in self._workers:
            worker.conn.send_bytes(payload)

    def _answers(self, command: str):
        """Every worker's answer to its oldest unanswered command; for ``execute`` with stages, the
        last stage's output (None otherwise: rank 0's own result is the output)."""
        answers = self._wait_for(OK, process_group.COLLECTIVE_TIMEOUT.total_seconds(), f"running {command}")
        if command == "execute" and self.output_rank != 0:
            return answers[self.output_rank][1]
        return None

    def _check_workers_alive(self) -> None:
        if any(not w.is_alive() for w in self._workers):
            raise _WorkerGone()

    def _wait_for(self, expected: str, timeout: float, doing: str) -> dict[int, tuple]:
        """Receive ``expected`` from every worker (its messages, by rank); a worker's error or exit
        raises (its socket closes)."""
        pending = {w.conn: w for w in self._workers}
        answers: dict[int, tuple] = {}
        deadline = time.monotonic() + timeout
        while pending:
            ready = wait(list(pending), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                ranks = ", ".join(str(w.rank) for w in pending.values())
                raise _WorkerGone(
                    f"{self.kind} worker rank(s) {ranks} did not answer within {timeout:.0f}s while {doing}"
                )
            for conn in ready:
                try:
                    message = conn.recv()
                except (EOFError, OSError):  # the worker exited
                    raise _WorkerGone() from None
                if message[0] != expected:
                    pending[conn].error_message = message  # an error report: _fail reads it
                    raise _WorkerGone()
                answers[pending.pop(conn).rank] = message
        return answers

    # -- failure ----------------------------------------------------------------------------------
    def _fail(self, exc: BaseException, outcome: str) -> ExecutorDeadError:
        """Find which rank broke, stop the group, and return the error to raise (one line naming the
        rank and how it ended, then ``outcome``)."""
        reports = self._collect_reports()
        if isinstance(exc, _WorkerGone):
            fallback = str(exc) or f"a {self.kind} worker stopped answering"
        else:
            fallback = f"{self.kind} rank 0 failed: {type(exc).__name__}: {exc}"
        self.dead_reason = f"{describe_failure(reports, fallback, self._worker_name)}; {outcome}"
        culprit = blame(reports)
        for report in reports:  # the cause's traceback; the others' only say they lost a peer
            if report.traceback:
                (log.error if report is culprit else log.info)(
                    "tensor_parallel.worker_error", rank=report.rank, traceback=report.traceback
                )
        log.info("tensor_parallel.failed", reason=self.dead_reason)  # the error raised carries it
        self._stop_workers(graceful=False)
        return ExecutorDeadError(self.dead_reason)

    def _collect_reports(self) -> list[WorkerReport]:
        """What each worker says or how it ended, waiting up to FAILURE_GRACE_S for all of them."""
        reports = {w.rank: WorkerReport(w.rank) for w in self._workers}
        for worker in self._workers:
            if worker.error_message is not None:
                _record(reports[worker.rank], worker.error_message)
        deadline = time.monotonic() + FAILURE_GRACE_S
        while True:
            waiting = []
            for worker in self._workers:
                report = reports[worker.rank]
                closed = _drain(worker.conn, report)
                if closed and worker.wait(deadline - time.monotonic()):  # exited: how, and its last words
                    worker.record_end(report)
                elif report.summary is None and not closed:
                    waiting.append(worker)
            remaining = deadline - time.monotonic()
            if not waiting or remaining <= 0:
                return list(reports.values())
            wait([w.conn for w in waiting], timeout=remaining)

    def _stop_workers(self, graceful: bool = True) -> None:
        """Wait for the workers to exit (``graceful``: up to STOP_GRACE_S, after ``shutdown``), then
        kill what is left (workers ignore SIGTERM: rank 0 stops them)."""
        deadline = time.monotonic() + (STOP_GRACE_S if graceful else 0.0)
        for worker in self._workers:
            worker.wait(deadline - time.monotonic())
        for worker in self._workers:
            worker.kill()
            worker.close()
        self._launcher.close()


class _WorkerGone(HeteroError):
    """A worker died, reported an error or did not answer (``_fail`` finds out which)."""


def _record(report: WorkerReport, message) -> None:
    if message and message[0] == ERROR:
        _, report.error_time, report.summary, report.traceback = message


def _drain(conn, report: WorkerReport) -> bool:
    """Record what the worker sent; True when its end is closed (it exited)."""
    try:
        while conn.poll():
            _record(report, conn.recv())
    except (EOFError, OSError):
        return True
    return False


@atexit.register
def _shutdown_live_executors() -> None:
    """A script that never calls ``shutdown()``: stop its groups before the interpreter tears down
    (gloo's threads destroyed at exit abort the process: 'terminate called without an active exception')."""
    for executor in list(_LIVE):
        try:
            executor.shutdown()
        except Exception:  # exiting anyway: one failed stop must not keep the others running
            pass
