"""A Ray cluster's address, checked before Ray is asked to connect (Ray itself retries an unreachable
address for minutes): by ``hetero serve``'s replicas and the ``ray`` distributed executor backend.
Imports no Ray."""

from __future__ import annotations

import socket

from hetero_core.errors import ConfigError, HeteroError

CONNECT_TIMEOUT_S = 10.0


def check_reachable(address: str) -> None:
    """Fail in one line at once when ``address`` is malformed or nothing answers there."""
    if address == "auto":  # Ray's own: the cluster already running on this machine
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not (sep and host and port.isdigit()):
        raise ConfigError(
            f"ray_address {address!r} is not HOST:PORT (the head's GCS), ray://HOST:PORT "
            "(Ray Client), auto or local"
        )
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise HeteroError(
            f"could not connect to the Ray cluster at {address!r}: {exc.strerror or exc}"
        ) from None
