"""The executor a tensor-parallel engine sees: rank 0 here, ranks 1..size-1 in spawned workers.

The scheduler and the KV bookkeeping run once, in the engine's process. Each step rank 0 sends the
same ``Batch`` to every worker (pickled once, down one pipe per worker), runs its own shard, and
waits for every worker's answer; all ranks meet in the model's collectives, and the gathered logits
of rank 0 are the step's output. Block copies and swaps go to every rank the same way, since each
rank owns its share of the KV heads.

Any failure in a step (a worker's exception, a killed worker, a collective timing out) stops the
group: the workers are stopped and this and every later call raises ``ExecutorDeadError`` naming
the rank, which the engine lets through. Rank 0 watches the workers' process sentinels, so a
worker killed while rank 0 waits for it is noticed at once. ``shutdown()`` stops the workers.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait

import torch.multiprocessing

from hetero_core.distributed import process_group
from hetero_core.distributed.failures import WorkerReport, blame, describe_failure
from hetero_core.distributed.worker import ERROR, OK, READY, STARTED, worker_main
from hetero_core.engine.batch import Batch, ExecutorOutput
from hetero_core.errors import ConfigError, ExecutorDeadError, HeteroError
from hetero_core.logging import get_logger

log = get_logger("hetero.tensor_parallel")
BLOCK_TRANSFERS = ("copy_blocks", "swap_out", "swap_in")
FAILURE_GRACE_S = 5.0  # after a failure: how long the workers get to report or exit
STOP_GRACE_S = 10.0  # at shutdown: how long a worker gets to finish before it is terminated


@dataclass
class _Worker:
    rank: int
    process: object  # a spawn-context Process
    conn: Connection
    error_message: tuple | None = None  # an error report received while waiting for something else


class TensorParallelExecutor:
    """``factory(ctx)`` builds one rank's executor (the executor's own factory, picklable:
    a module-level function); ``ctx.tensor_parallel_size`` ranks in all."""

    def __init__(self, factory, ctx, executor_name: str):
        self.size = ctx.tensor_parallel_size
        self.executor_name = executor_name
        self.dead_reason: str | None = None
        self._workers: list[_Worker] = []
        self._closed = False
        self.local = None
        if process_group.dist.is_initialized():
            raise ConfigError("a torch.distributed process group already exists in this process (another "
                              "tensor-parallel engine, or torchrun); shut it down before starting one")
        try:
            self._start(factory, ctx)
        except BaseException:
            self._stop_workers(graceful=False)
            process_group.destroy_group()
            raise
        for method in BLOCK_TRANSFERS:  # mirror what the rank executors can do (see block_transfer)
            if not callable(getattr(self.local, method, None)):
                setattr(self, method, None)

    def _start(self, factory, ctx) -> None:
        backend = process_group.backend()
        store = process_group.host_store(self.size)
        spawn = torch.multiprocessing.get_context("spawn")
        for rank in range(1, self.size):
            parent, child = spawn.Pipe()
            process = spawn.Process(target=worker_main, name=f"hetero-tp-rank{rank}", daemon=True,
                                    args=(rank, self.size, store.port, backend, factory, ctx, child))
            try:
                process.start()
            except (pickle.PicklingError, AttributeError, TypeError) as exc:
                raise ConfigError(f"executor '{self.executor_name}' cannot start tensor-parallel workers: "
                                  f"its factory or context cannot be sent to another process ({exc})") from None
            finally:
                child.close()
            self._workers.append(_Worker(rank, process, parent))
        self._wait_for(STARTED, process_group.START_TIMEOUT.total_seconds(), "starting")
        process_group.init_group(store, 0, self.size, backend)
        self.local = factory(replace(ctx, tensor_parallel_rank=0))
        self._wait_for(READY, process_group.START_TIMEOUT.total_seconds(), "loading its shard")
        log.info("tensor_parallel.ready", size=self.size, backend=backend, executor=self.executor_name,
                 workers=[w.process.pid for w in self._workers])

    # -- the executor -----------------------------------------------------------------------------
    def execute(self, batch: Batch) -> ExecutorOutput:
        return self._everywhere("execute", batch)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        self._everywhere("copy_blocks", pairs)

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        self._everywhere("swap_out", pairs)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        self._everywhere("swap_in", pairs)

    def shutdown(self) -> None:
        """Stop the workers and release rank 0's shard; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
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
        return [w.process.pid for w in self._workers]

    def __getattr__(self, name):
        """Everything else (``vocab_size``, ``eos_token_id``, ``model``, ...) is rank 0's."""
        local = self.__dict__.get("local")
        if local is None or name.startswith("_"):
            raise AttributeError(name)
        return getattr(local, name)

    # -- one command on every rank ----------------------------------------------------------------
    def _everywhere(self, command: str, *args):
        if self.dead_reason is not None:
            raise ExecutorDeadError(self.dead_reason)
        if self._closed:
            raise ExecutorDeadError("the tensor-parallel executor was shut down")
        try:
            self._check_workers_alive()
            payload = pickle.dumps((command, args))
            for worker in self._workers:
                worker.conn.send_bytes(payload)
            result = getattr(self.local, command)(*args)
            self._wait_for(OK, process_group.COLLECTIVE_TIMEOUT.total_seconds(), f"running {command}")
        except ExecutorDeadError:
            raise
        except Exception as exc:  # noqa: BLE001 - ranks may now disagree: the group cannot go on
            raise self._fail(exc) from exc
        return result

    def _check_workers_alive(self) -> None:
        if any(not w.process.is_alive() for w in self._workers):
            raise _WorkerGone()

    def _wait_for(self, expected: str, timeout: float, doing: str) -> None:
        """Receive ``expected`` from every worker; a worker's error or death raises (sentinels watched)."""
        pending = {w.conn: w for w in self._workers}
        deadline = time.monotonic() + timeout
        while pending:
            sentinels = {w.process.sentinel: w for w in pending.values()}
            ready = wait([*pending, *sentinels], timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                ranks = ", ".join(str(w.rank) for w in pending.values())
                raise _WorkerGone(f"tensor-parallel worker rank(s) {ranks} did not answer within "
                                  f"{timeout:.0f}s while {doing}")
            for item in ready:
                if item in pending:
                    try:
                        message = pending[item].conn.recv()
                    except (EOFError, OSError):
                        raise _WorkerGone() from None
                    if message[0] != expected:
                        pending[item].error_message = message  # an error report: _fail reads it
                        raise _WorkerGone()
                    del pending[item]
                elif item in sentinels and sentinels[item].conn not in {c for c in ready}:
                    raise _WorkerGone()

    # -- failure ----------------------------------------------------------------------------------
    def _fail(self, exc: BaseException) -> ExecutorDeadError:
        """Find which rank broke, stop the group, and return the error to raise (naming the rank)."""
        reports = self._collect_reports()
        if isinstance(exc, _WorkerGone):
            fallback = str(exc) or "a tensor-parallel worker stopped answering"
        else:
            fallback = f"tensor-parallel rank 0 failed: {type(exc).__name__}: {exc}"
        self.dead_reason = describe_failure(reports, fallback) + "; the engine has stopped"
        culprit = blame(reports)
        for report in reports:  # the cause's traceback; the others' only say they lost a peer
            if report.traceback:
                (log.error if report is culprit else log.info)(
                    "tensor_parallel.worker_error", rank=report.rank, traceback=report.traceback)
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
                _drain(worker.conn, report)
                if not worker.process.is_alive():
                    report.exitcode = worker.process.exitcode
                    _drain(worker.conn, report)
                elif report.summary is None:
                    waiting.append(worker)
            remaining = deadline - time.monotonic()
            if not waiting or remaining <= 0:
                return list(reports.values())
            wait([w.conn for w in waiting] + [w.process.sentinel for w in waiting], timeout=remaining)

    def _stop_workers(self, graceful: bool = True) -> None:
        """Join the workers (``graceful``: give them STOP_GRACE_S to finish first), then terminate
        and, if need be, kill what is left."""
        deadline = time.monotonic() + (STOP_GRACE_S if graceful else 0.0)
        for worker in self._workers:
            worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
        for worker in self._workers:
            if worker.process.is_alive():
                worker.process.terminate()
                worker.process.join(timeout=5)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.conn.close()


class _WorkerGone(HeteroError):
    """A worker died, reported an error or did not answer (``_fail`` finds out which)."""


def _record(report: WorkerReport, message) -> None:
    if message and message[0] == ERROR:
        _, report.error_time, report.summary, report.traceback = message


def _drain(conn: Connection, report: WorkerReport) -> None:
    try:
        while conn.poll():
            _record(report, conn.recv())
    except (EOFError, OSError):
        pass
