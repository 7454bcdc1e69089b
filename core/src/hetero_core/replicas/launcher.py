"""Run the replicas application: on a local Ray instance (started here, stopped on exit) or on an
existing cluster (``ray_address``; only our application is removed on exit). What ``hetero serve
--replicas N`` does, until Ctrl-C or SIGTERM (``hetero_core.server.signals``): a local Ray's processes
start with both signals blocked, so that one sent to the whole process group (or service) does not
kill them under the application; the application is removed first (its replicas get
``graceful_shutdown_seconds`` to finish their requests), then Ray is stopped."""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import ray
from ray import serve
from ray.serve.config import HTTPOptions

from hetero_core.distributed.ray_address import check_reachable
from hetero_core.errors import ConfigError, HeteroError
from hetero_core.replicas.deployment import build_application
from hetero_core.server.settings import ServerSettings
from hetero_core.server.signals import signals_blocked_in_children, take_back_sigterm

APP_NAME = "hetero"


def connect(server: ServerSettings, log_level: str = "warning") -> bool:
    """Join the cluster at ``server.ray_address``, or start a local instance sized for the replicas (no
    address, or ``local``: Ray's name for a new one). True when this call started Ray (the caller stops
    it)."""
    if ray.is_initialized():
        return False
    level = log_level.upper()
    if server.ray_address not in (None, "local"):
        check_reachable(server.ray_address)
        try:
            ray.init(address=server.ray_address, logging_level=level)
        except Exception as exc:  # ConnectionError, an authentication failure, ...
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise HeteroError(
                f"could not connect to the Ray cluster at {server.ray_address!r}: {reason} (a "
                "cluster with token authentication needs RAY_AUTH_MODE=token and its token)"
            ) from None
        return False
    num_cpus = max(os.cpu_count() or 1, math.ceil(server.replicas * server.replica_cpus))
    ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level=level)
    num_gpus = ray.cluster_resources().get("GPU", 0)
    if server.replicas * server.replica_gpus > num_gpus:
        ray.shutdown()
        raise ConfigError(
            f"--replicas {server.replicas} with --replica-gpus {server.replica_gpus:g} needs "
            f"{server.replicas * server.replica_gpus:g} GPUs; this machine has {num_gpus:g}"
        )
    return True


def deploy(settings, server: ServerSettings) -> str:
    """Start Serve's HTTP proxy on ``host:port`` and the application; returns its URL once every replica
    is up. (On a cluster whose Serve already runs, its proxy keeps the address it has.)"""
    level = settings.log_level.upper()
    logging.getLogger("ray.serve").setLevel(level)  # this process's Serve messages
    serve.start(
        http_options=HTTPOptions(host=server.host, port=server.port), logging_config={"log_level": level}
    )
    try:
        serve.run(build_application(settings, server), name=APP_NAME, route_prefix="/")
    except RuntimeError as exc:  # a replica's constructor failed (a wrong setting, a missing model)
        raise HeteroError(f"the replicas did not start: {_failure_reason(exc)}") from None
    return f"http://{server.host}:{server.port}"


def stop(started_ray: bool) -> None:
    """Remove the application (its replicas get ``graceful_shutdown_seconds`` to finish their requests);
    stop Ray too when it was started here. Nothing to do when Ray is not up (it failed to start)."""
    if not ray.is_initialized():
        return
    try:
        serve.delete(APP_NAME)
    finally:
        if started_ray:
            ray.shutdown()


def serve_replicas(settings, server: ServerSettings) -> None:
    """Serve until SIGINT or SIGTERM (made to interrupt by the caller, ``sigterm_interrupts``): the
    ``KeyboardInterrupt`` comes out once the application, and Ray when started here, are stopped."""
    starts_ray = not ray.is_initialized() and server.ray_address in (None, "local")
    try:
        with signals_blocked_in_children(), _sigterm_during_ray_init_is_a_stop():
            connect(server, settings.log_level)
        url = deploy(settings, server)
        where = "a local Ray instance" if starts_ray else f"the Ray cluster at {server.ray_address}"
        print(
            f"hetero: serving {server.replicas} engine replica(s) on {where} at {url} (Ctrl-C stops)",
            file=sys.stderr,
        )
        while True:  # until a signal's handler interrupts it (in this thread, within a second)
            time.sleep(1.0)
    finally:
        stop(starts_ray)


@contextmanager
def _sigterm_during_ray_init_is_a_stop() -> Iterator[None]:
    """``ray.init`` installs a SIGTERM handler that calls ``sys.exit``: a SIGTERM meanwhile is a stop
    like any other (KeyboardInterrupt), and SIGTERM interrupts again afterwards."""
    try:
        yield
        take_back_sigterm()
    except SystemExit:
        raise KeyboardInterrupt from None


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
