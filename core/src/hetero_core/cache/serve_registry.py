"""Running ``hetero serve`` processes, recorded in the cache so that ``hetero run`` can reuse one.

Each plain ``hetero serve`` writes one small JSON file, ``<cache_dir>/servers/<host>-<pid>-<port>.json``,
once it accepts connections (its address, pid, the identity of what it computes, whether it needs an API
key, whether its model has a chat template) and removes it when it exits cleanly (Ctrl-C, SIGTERM, an
error after start). A server that died without cleaning up leaves its file behind, so a reader trusts a
record only while it is live: written on this machine, its pid a running process and its port accepting
a TCP connection; a record failing the pid or port probe is deleted, one that does not parse is
skipped. Files are written whole (``atomic_file``), so a reader never sees half of one.

This module knows nothing of settings: the identity is an opaque JSON object that the writer and the
reader compute the same way (``hetero_core.cli.serve_identity``). It imports only the standard library,
since ``hetero run`` reads it before deciding whether to import torch at all.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hetero_core.cache.atomic_file import replaced_atomically

REGISTRY_DIR = "servers"
FORMAT = 1  # a record of another format is skipped
PROBE_TIMEOUT_S = 0.5  # a local port that accepts, accepts at once; one that refuses, refuses at once
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


@dataclass(frozen=True)
class ServerRecord:
    """One running ``hetero serve``: where it listens and what it computes."""

    host: str  # as bound (a wildcard address is reached on loopback)
    port: int
    pid: int
    model_name: str  # the id its API answers to (``--served-model-name`` or the model)
    identity: dict  # what must equal the reader's for its answers to be the reader's own
    needs_api_key: bool
    has_chat_template: bool
    machine: str = field(default_factory=socket.gethostname)
    format: int = FORMAT

    @property
    def connect_host(self) -> str:
        """The address a client on this machine connects to."""
        return _WILDCARDS.get(self.host, self.host)

    @property
    def url(self) -> str:
        host = self.connect_host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"


def registry_dir(cache_dir: Path) -> Path:
    return Path(cache_dir) / REGISTRY_DIR


def record_server(cache_dir: Path, record: ServerRecord) -> Path:
    """Write ``record`` (replacing an earlier one of the same process and port); returns its path."""
    path = registry_dir(cache_dir) / f"{record.machine}-{record.pid}-{record.port}.json"
    with replaced_atomically(path, ".tmp") as tmp:
        Path(tmp).write_text(json.dumps(asdict(record), sort_keys=True), encoding="utf-8")
    return path


def remove_record(path: Path) -> None:
    """Remove a server's record (at its exit); gone already is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def live_servers(cache_dir: Path) -> list[ServerRecord]:
    """The recorded servers that are running now, oldest record first; stale records are deleted."""
    directory = registry_dir(cache_dir)
    try:
        paths = sorted(directory.glob("*.json"), key=_mtime)
    except OSError:
        return []
    live = []
    for path in paths:
        record = _read(path)
        if record is None or record.machine != socket.gethostname():
            continue  # unreadable or another format: not ours to judge; another machine's: not probed
        if _pid_running(record.pid) and _port_accepts(record.connect_host, record.port):
            live.append(record)
        else:
            remove_record(path)
    return live


def _read(path: Path) -> ServerRecord | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT:
            return None
        return ServerRecord(**data)
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _pid_running(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def _port_accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False
