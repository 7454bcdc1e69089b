"""Run the replicas application: on a local Ray instance (started here, stopped on exit) or on an
existing cluster (``ray_address``; only our application is removed on exit). What ``hetero serve
--replicas N`` does."""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import sys
import threading

import ray
from ray import serve
from ray.serve.config import HTTPOptions

from hetero_core.errors import ConfigError, HeteroError
from hetero_core.replicas.deployment import build_application
from hetero_core.server.settings import ServerSettings

APP_NAME = "hetero"
CONNECT_TIMEOUT_S = 10.0


def connect(server: ServerSettings, log_level: str = "warning") -> bool:
    """Join the cluster at ``server.ray_address``, or start a local instance sized for the replicas (no
    address, or ``local``: Ray's name for a new one). True when this call started Ray (the caller stops it)."""
    if ray.is_initialized():
        return False
    level = log_level.upper()
    if server.ray_address not in (None, "local"):
        _check_reachable(server.ray_address)
        try:
            ray.init(address=server.ray_address, logging_level=level)
        except Exception as exc:  # ConnectionError, an authentication failure, ...
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise HeteroError(f"could not connect to the Ray cluster at {server.ray_address!r}: {reason} (a "
                              "cluster with token authentication needs RAY_AUTH_MODE=token and its token)") from None
        return False
    num_cpus = max(os.cpu_count() or 1, math.ceil(server.replicas * server.replica_cpus))
    ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level=level)
    num_gpus = ray.cluster_resources().get("GPU", 0)
    if server.replicas * server.replica_gpus > num_gpus:
        ray.shutdown()
        raise ConfigError(f"--replicas {server.replicas} with --replica-gpus {server.replica_gpus:g} needs "
                          f"{server.replicas * server.replica_gpus:g} GPUs; this machine has {num_gpus:g}")
    return True


def deploy(settings, server: ServerSettings) -> str:
    """Start Serve's HTTP proxy on ``host:port`` and the application; returns its URL once every replica
    is up. (On a cluster whose Serve already runs, its proxy keeps the address it has.)"""
    level = settings.log_level.upper()
    logging.getLogger("ray.serve").setLevel(level)  # this process's Serve messages
    serve.start(http_options=HTTPOptions(host=server.host, port=server.port), logging_config={"log_level": level})
    try:
        serve.run(build_application(settings, server), name=APP_NAME, route_prefix="/")
    except RuntimeError as exc:  # a replica's constructor failed (a wrong setting, a missing model)
        raise HeteroError(f"the replicas did not start: {_failure_reason(exc)}") from None
    return f"http://{server.host}:{server.port}"


def stop(started_ray: bool) -> None:
    """Remove the application (its replicas get ``graceful_shutdown_seconds`` to finish their requests);
    stop Ray too when it was started here."""
    try:
        serve.delete(APP_NAME)
    finally:
        if started_ray:
            ray.shutdown()


def serve_replicas(settings, server: ServerSettings) -> bool:
    """Serve until SIGINT or SIGTERM; True when a signal stopped it (as ``run_server``)."""
    started_ray = connect(server, settings.log_level)
    try:
        url = deploy(settings, server)
        where = "a local Ray instance" if started_ray else f"the Ray cluster at {server.ray_address}"
        print(f"hetero: serving {server.replicas} engine replica(s) on {where} at {url} (Ctrl-C stops)",
              file=sys.stderr)
        _wait_for_signal()
        return True
    finally:
        stop(started_ray)


def _check_reachable(address: str) -> None:
    """Fail in one line at once: Ray itself retries an unreachable address for minutes."""
    if address == "auto":  # Ray's own: the cluster already running on this machine
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not (sep and host and port.isdigit()):
        raise ConfigError(f"ray_address {address!r} is not HOST:PORT (the head's GCS), ray://HOST:PORT "
                          "(Ray Client), auto or local")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise HeteroError(f"could not connect to the Ray cluster at {address!r}: {exc.strerror or exc}") from None


def _wait_for_signal() -> None:
    stopped = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopped.set())
    while not stopped.wait(1.0):
        pass


def _failure_reason(exc: RuntimeError) -> str:
    """Why the deployment failed, in one line: the exception that ended a replica's constructor (the
    last line of the traceback in the deployment's status), else Serve's own message."""
    try:
        deployments = serve.status().applications[APP_NAME].deployments.values()
    except Exception:  # noqa: BLE001  (only a better message is lost)
        deployments = []
    for deployment in deployments:
        for line in reversed(deployment.message.splitlines()):
            name, sep, rest = line.strip().partition(": ")
            if sep and " " not in name and name.rsplit(".", 1)[-1].endswith(("Error", "Exception")):
                return f"{name.rsplit('.', 1)[-1]}: {rest}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
