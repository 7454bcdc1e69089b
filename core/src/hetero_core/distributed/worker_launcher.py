"""How a tensor- or pipeline-parallel group's workers start and where they run: the seam between the
executor (rank 0, ``tensor_parallel_executor.py``) and the processes of ranks 1..size-1.

Two backends (``distributed_executor_backend``, vLLM's name): ``mp``, local processes
(``worker_process.LocalProcessLauncher``), and ``ray``, Ray actors placed on a cluster with a placement
group (``ray_launcher.RayLauncher``, which alone imports Ray). Both run the same worker loop
(``worker.run``) behind a ``multiprocessing`` connection, so the executor sends commands, reads
answers and notices a death the same way whatever runs its ranks; only starting them, the rendezvous
address and how a worker's end is found out differ.
"""

from __future__ import annotations

from multiprocessing.connection import Connection
from typing import Protocol

from hetero_core.distributed.failures import WorkerReport
from hetero_core.errors import ConfigError

BACKENDS = ("mp", "ray")
RAY_EXTRA_HINT = "distributed_executor_backend 'ray' runs the ranks on Ray: pip install 'hetero-core[ray]'"


class RankWorker(Protocol):
    """One worker rank as rank 0 sees it."""

    rank: int
    conn: Connection  # rank 0's end: commands down, answers up; reads as closed once the worker is gone
    error_message: tuple | None  # an error report received while waiting for something else
    pid: int
    where: str | None  # how errors place it ("on node 10.0.0.5 (1a2b3c4d)"); None: this machine

    def send_setup(self, setup: dict, payload: bytes) -> None:
        """The worker's setup (builtins only) and the pickled ``(factory, ctx)``."""

    def is_alive(self) -> bool: ...

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the worker to end; True when it has."""

    def record_end(self, report: WorkerReport) -> None:
        """Put how the worker ended (once ``wait`` said it has) into ``report``."""

    def kill(self) -> None: ...

    def close(self) -> None: ...


class WorkerLauncher(Protocol):
    """Starts the workers of one group and releases what it holds for them."""

    rendezvous_host: str | None  # where rank 0's store listens, as the workers reach it (after start)
    where: str | None  # rank 0's place, for errors and logs (None: this machine)

    def start(self, world_size: int) -> list[RankWorker]:
        """Start ranks 1..world_size-1 (a failure raises, with what was started released)."""

    def node_ids(self) -> list[str | None]:
        """Each rank's node (rank 0 first); None where the launcher has no nodes (local processes)."""

    def close(self) -> None:
        """Release what ``start`` reserved (a placement group, a Ray connection); idempotent."""


def launcher_for(ctx) -> WorkerLauncher:
    """The launcher ``ctx.settings.distributed_executor_backend`` names (Ray imported only for ``ray``)."""
    backend = ctx.settings.distributed_executor_backend
    if backend == "mp":
        from hetero_core.distributed.worker_process import LocalProcessLauncher

        return LocalProcessLauncher()
    if backend != "ray":
        raise ConfigError(
            f"unknown distributed_executor_backend {backend!r}; available: {', '.join(BACKENDS)}"
        )
    try:
        from hetero_core.distributed.ray_launcher import RayLauncher
    except ImportError as exc:
        if exc.name is not None and exc.name.split(".")[0] == "ray":
            raise ConfigError(RAY_EXTRA_HINT) from None
        raise
    return RayLauncher(ctx.settings.ray_address, getattr(ctx.options, "device", "cpu"))
