"""The ``ray`` distributed executor backend: a group's worker ranks as Ray actors on a cluster.

``RayLauncher.start`` joins the cluster (``ray_address``; a new local instance without one; the
connection already up in a Ray Serve replica or a script that called ``ray.init``), reserves one
bundle per rank with a placement group (``{"CPU": 1}`` each; the first also asks for this node, as
vLLM does, since rank 0 runs in this process and takes the bundle on this node), starts a
``RankActor`` in each other bundle, and waits for each to connect back to rank 0 on this node's
address (a port the OS picks; the actors prove themselves with a random token before anything is
unpickled). The rendezvous store and gloo then use the same address, so ranks on other machines
reach rank 0 and one another (``node_interface.py``).

``RayWorker`` is rank 0's view of one actor: the connection carries the commands and answers exactly
as a local worker's socket does; the actor's ``run`` task, which lasts as long as the worker, says
when it ended and, through Ray's death cause, how (a killed process, a lost node), with its node.
Only this module and ``ray_rank.py`` import Ray.
"""

from __future__ import annotations

import hmac
import logging
import re
import secrets
import signal
import socket
import threading
import time
from multiprocessing.connection import Connection

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hetero_core.distributed.failures import WorkerReport
from hetero_core.distributed.node_interface import pin_gloo_interface
from hetero_core.distributed.ray_address import check_reachable
from hetero_core.distributed.ray_rank import RankActor
from hetero_core.errors import ConfigError, HeteroError
from hetero_core.model.cpu.threads import available_cpus, is_cpu_device

PLACEMENT_TIMEOUT_S = 60.0  # for the cluster to find room for every rank's bundle
CONNECT_TIMEOUT_S = 300.0  # for every actor to start (a fresh worker process imports Hetero) and connect
ACCEPT_POLL_S = 0.5  # between checks that an actor that has not connected yet is still starting
HANDSHAKE_TIMEOUT_S = 10.0  # for a connection's token and hello
LOCAL_OBJECT_STORE_BYTES = 128 * 1024**2  # a local instance's (nothing large travels through it)
_WORKER_EXIT = re.compile(
    r"(?P<what>.*?)\.? Worker exit type: (?P<type>\S+) Worker exit detail: (?P<detail>.*)"
)
NODE_BUNDLE_SHARE = 0.001  # of this node's ``node:IP`` resource: rank 0's bundle lands on this node


class RayLauncher:
    """Starts ranks 1..size-1 as ``RankActor``s on the Ray cluster at ``address``."""

    def __init__(self, address: str | None, device: str = "cpu") -> None:
        if address is not None and address.startswith("ray://"):
            raise ConfigError(
                f"ray_address {address!r}: distributed_executor_backend 'ray' runs rank 0 in this process, "
                "which every rank connects to, so it must run on a node of the cluster: give the head's "
                "HOST:PORT (its GCS) or auto, not a Ray Client address"
            )
        if not is_cpu_device(device):
            raise ConfigError(
                f"distributed_executor_backend 'ray' runs CPU ranks (gloo) so far, not device {device!r}; "
                "use distributed_executor_backend 'mp' for CUDA ranks on one machine"
            )
        self.address = address
        self.rendezvous_host: str | None = None  # this node's address, once start has joined the cluster
        self.where: str | None = None
        self._started_ray = False
        self._placement = None
        self._node_ids: list[str] = []
        self._workers: list[RayWorker] = []

    def start(self, world_size: int) -> list[RayWorker]:
        try:
            self._connect(world_size)
            host, node_id = ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()
            self.rendezvous_host, self.where = host, _node_place(host, node_id)
            pin_gloo_interface(host)  # rank 0's gloo, in this process
            bundles = self._place(world_size, host, node_id)
            self._workers = self._start_actors(bundles)
        except BaseException:
            self.close()
            raise
        return self._workers

    def node_ids(self) -> list[str]:
        return list(self._node_ids)

    def close(self) -> None:
        if not ray.is_initialized():  # shut down already (at interpreter exit, Ray's own hook runs first)
            return
        for worker in self._workers:
            worker.kill()
        if self._placement is not None:
            remove_placement_group(self._placement)
            self._placement = None
        if self._started_ray:
            self._started_ray = False
            ray.shutdown()

    # -- starting ---------------------------------------------------------------------------------
    def _connect(self, world_size: int) -> None:
        """Join the cluster (``ray_address``), or start a local instance; nothing when Ray is up."""
        if ray.is_initialized():
            return
        on_main_thread = threading.current_thread() is threading.main_thread()
        sigterm = signal.getsignal(signal.SIGTERM) if on_main_thread else None
        try:
            if self.address in (None, "local"):
                ray.init(
                    num_cpus=max(available_cpus(), world_size),
                    object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                    include_dashboard=False,
                    logging_level=logging.WARNING,
                )
            else:
                check_reachable(self.address)
                try:
                    ray.init(address=self.address, logging_level=logging.WARNING)
                except Exception as exc:  # ConnectionError, an authentication failure, ...
                    raise HeteroError(
                        f"could not connect to the Ray cluster at {self.address!r}: {_first_line(exc)} (a "
                        "cluster with token authentication needs RAY_AUTH_MODE=token and its token)"
                    ) from None
        finally:
            if sigterm is not None:  # ray.init installs a SIGTERM handler that calls sys.exit
                signal.signal(signal.SIGTERM, sigterm)
        self._started_ray = True

    def _place(self, world_size: int, host: str, node_id: str) -> list[int]:
        """Reserve a bundle per rank; the bundle indices of ranks 1..size-1 (rank 0 takes one here)."""
        bundles = [{"CPU": 1.0} for _ in range(world_size)]
        bundles[0][f"node:{host}"] = NODE_BUNDLE_SHARE
        self._placement = placement_group(bundles, strategy="PACK")
        if not self._placement.wait(PLACEMENT_TIMEOUT_S):
            free = ray.available_resources().get("CPU", 0)
            raise ConfigError(
                f"the Ray cluster found no room for {world_size} ranks of 1 CPU each (one on this node, "
                f"{host}) within {PLACEMENT_TIMEOUT_S:.0f}s; its free CPUs: {free:g}; add nodes or CPUs, or "
                "use smaller tensor_parallel_size / pipeline_parallel_size"
            )
        nodes = placement_group_table(self._placement)["bundles_to_node_id"]
        here = [index for index in sorted(nodes) if nodes[index] == node_id]
        if not here:  # several nodes share this address (one machine): the bundle went to another
            raise ConfigError(
                f"the Ray placement group put no rank on this process's node ({_node_place(host, node_id)}), "
                "where rank 0 runs; run hetero on a node with a free CPU"
            )
        order = here[:1] + [index for index in sorted(nodes) if index != here[0]]
        self._node_ids = [nodes[index] for index in order]
        return order[1:]

    def _start_actors(self, bundles: list[int]) -> list[RayWorker]:
        listener = socket.create_server((self.rendezvous_host, 0))
        listener.settimeout(ACCEPT_POLL_S)
        address, token = listener.getsockname()[:2], secrets.token_bytes(32)
        starting = {}
        try:
            for rank, bundle in enumerate(bundles, start=1):
                actor = RankActor.options(
                    num_cpus=1,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self._placement, placement_group_bundle_index=bundle
                    ),
                ).remote()
                starting[rank] = (actor, actor.run.remote(rank, address, token))
            return self._accept(listener, token, starting)
        except BaseException:
            for actor, _ in starting.values():
                ray.kill(actor, no_restart=True)
            raise
        finally:
            listener.close()

    def _accept(self, listener: socket.socket, token: bytes, starting: dict) -> list[RayWorker]:
        """Each actor's connection, in rank order; an actor that fails to start raises at once."""
        workers: dict[int, RayWorker] = {}
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while len(workers) < len(starting):
            waiting = {run: rank for rank, (_, run) in starting.items() if rank not in workers}
            ended, _ = ray.wait(list(waiting), num_returns=1, timeout=0, fetch_local=False)
            for run in ended:
                raise HeteroError(
                    f"the Ray actor of worker rank {waiting[run]} did not start: {_task_failure(run)}"
                )
            if time.monotonic() > deadline:
                raise HeteroError(
                    f"worker rank(s) {', '.join(map(str, waiting.values()))} did not connect to rank 0 at "
                    f"{address_text(listener)} within {CONNECT_TIMEOUT_S:.0f}s (can their nodes reach "
                    "this one?)"
                )
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            hello = _handshake(connection, token)
            if hello is None:
                continue
            rank, pid, node_id, node_ip, conn = hello
            if rank not in waiting.values():  # a rank that connected already, or none of ours
                conn.close()
                continue
            actor, run = starting[rank]
            workers[rank] = RayWorker(rank, actor, run, conn, pid, node_id, node_ip)
        return [workers[rank] for rank in sorted(workers)]


class RayWorker:
    """Rank 0's view of one ``RankActor``: its connection, its ``run`` task, its node."""

    error_message: tuple | None = None

    def __init__(self, rank, actor, run, conn: Connection, pid: int, node_id: str, node_ip: str) -> None:
        self.rank, self.actor, self.run, self.conn = rank, actor, run, conn
        self.pid, self.node_id, self.node_ip = pid, node_id, node_ip
        self.where = f"on node {_node_place(node_ip, node_id)}"

    def send_setup(self, setup: dict, payload: bytes) -> None:
        self.conn.send(setup)
        self.conn.send_bytes(payload)

    def is_alive(self) -> bool:
        return not self.wait(0.0)

    def wait(self, timeout: float) -> bool:
        if not ray.is_initialized():  # Ray shut down (its exit hook runs before ours): its actors with it
            return True
        ended, _ = ray.wait([self.run], timeout=max(0.0, timeout), fetch_local=False)
        return bool(ended)

    def record_end(self, report: WorkerReport) -> None:
        """Why Ray says the actor died (nothing when ``run`` returned: it was told to shut down)."""
        cause = _task_failure(self.run) if ray.is_initialized() else None
        if cause is not None:
            report.death_cause = cause

    def kill(self) -> None:
        if ray.is_initialized():
            ray.kill(self.actor, no_restart=True)

    def close(self) -> None:
        self.conn.close()


def _handshake(connection: socket.socket, token: bytes) -> tuple | None:
    """``(rank, pid, node_id, node_ip, conn)`` from an actor that sent the token; None (and the
    connection closed) from anything else."""
    connection.setblocking(True)
    conn = Connection(connection.detach())
    try:
        if conn.poll(HANDSHAKE_TIMEOUT_S) and hmac.compare_digest(conn.recv_bytes(len(token) + 1), token):
            if conn.poll(HANDSHAKE_TIMEOUT_S):
                rank, pid, node_id, node_ip = conn.recv()
                return rank, pid, node_id, node_ip, conn
    except (OSError, EOFError, ValueError, TypeError):
        pass
    conn.close()
    return None


def _task_failure(run) -> str | None:
    """How an ended ``run`` task failed, in one line (None: it returned)."""
    try:
        ray.get(run, timeout=0)
    except ray.exceptions.RayActorError as exc:
        return _death_cause(exc)
    except Exception as exc:  # noqa: BLE001 - the actor's own exception, as Ray passes it on
        cause = getattr(exc, "cause", None) or exc
        return f"{type(cause).__name__}: {_first_line(cause)}"
    return None


def _death_cause(exc: BaseException) -> str:
    """Ray's reason an actor died, in one line, without its list of possible causes."""
    text = " ".join(str(exc).split())
    reason = text.partition("The actor is dead because ")[2] or text
    for tail in (" Some common causes", " There are some potential", " If the process", " Check the"):
        reason = reason.split(tail)[0]
    worker = _WORKER_EXIT.match(
        reason
    )  # "its worker process has died. Worker exit type: X Worker exit detail: Y"
    if worker is not None:
        return f"{worker['what']} (Ray: exit type {worker['type']}, {worker['detail'].rstrip('. ')})"
    return f"{reason.rstrip('. ')} (Ray)"


def _node_place(ip: str, node_id: str) -> str:
    return f"{ip} ({node_id[:8]})"


def address_text(listener: socket.socket) -> str:
    host, port = listener.getsockname()[:2]
    return f"{host}:{port}"


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
