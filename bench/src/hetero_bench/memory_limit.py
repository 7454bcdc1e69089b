"""A memory limit for one benchmarked engine: a child cgroup of its own, with a cap, that the engine's
process starts inside.

``hetero bench memory --memory-limit 21G`` asks what a machine with that much memory runs, without
such a machine: each engine starts in a fresh cgroup whose ``memory.max`` is the limit, so going over
it is an OOM kill (counted in ``memory.events``), as on a smaller machine. cgroup v2 (the unified
hierarchy): a child of ``/sys/fs/cgroup``, whose memory controller is on for its children. cgroup v1
(a ``memory`` hierarchy, as in many containers): a child of this process's own memory cgroup
(``memory.limit_in_bytes``; ``oom_kill`` in ``memory.oom_control``). Either needs root; where neither
can be written, ``open_limit`` raises ``LimitUnavailable`` saying why, and the benchmark runs without.

The engine joins the cgroup before it runs: its command is wrapped in ``sh -c 'echo $$ > cgroup.procs
&& exec ...'``, so every page it and its children touch is charged there from the first. Closing kills
what is left in it and removes it.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class LimitUnavailable(Exception):
    """No cgroup can be made here; the message says why."""


def parse_size(text: str) -> int:
    """``21G``, ``512M``, ``1.5G``, ``2147483648`` -> bytes (binary units); ValueError otherwise."""
    match = _SIZE.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"expected a size such as 21G, 512M or a number of bytes, got {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


@dataclass(frozen=True)
class _Files:
    """The names of one cgroup version's files."""

    version: int
    limit: str
    peak: str | None
    events: str


V2 = _Files(2, "memory.max", "memory.peak", "memory.events")
V1 = _Files(1, "memory.limit_in_bytes", "memory.max_usage_in_bytes", "memory.oom_control")


class MemoryLimit:
    """One engine's cgroup: ``wrap(command)`` starts it inside; ``oom_kills()``, ``peak_mb()``, ``close()``
    (kill what is left, remove it)."""

    def __init__(self, path: Path, files: _Files, limit_bytes: int) -> None:
        self.path, self.files, self.limit_bytes = path, files, limit_bytes

    def wrap(self, command: list[str]) -> list[str]:
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs"), *command]

    def oom_kills(self) -> int:
        """OOM kills inside this cgroup so far (0 where the kernel does not count them)."""
        try:
            for line in (self.path / self.files.events).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def peak_mb(self) -> float | None:
        """The cgroup's peak charge (its processes' memory and the page cache they read), in MiB."""
        try:
            return int((self.path / self.files.peak).read_text()) / (1 << 20) if self.files.peak else None
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        """Kill what is left inside, then remove the cgroup."""
        for _ in range(50):
            try:
                pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            except OSError:
                break
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        try:
            self.path.rmdir()
        except OSError:
            pass


def open_limit(name: str, limit_bytes: int) -> MemoryLimit:
    """A fresh cgroup ``name`` capped at ``limit_bytes``; LimitUnavailable (why) where none can be made."""
    parent, files = _parent()
    path = parent / name
    try:
        path.mkdir()
    except FileExistsError:
        path.rmdir()  # an empty leftover of an earlier run of the same name
        path.mkdir()
    except OSError as exc:
        raise LimitUnavailable(f"cannot make a cgroup under {parent}: {exc.strerror}") from None
    limit = MemoryLimit(path, files, limit_bytes)
    try:
        (path / files.limit).write_text(str(limit_bytes))
        if files.version == 1 and (path / "memory.memsw.limit_in_bytes").exists():
            _write_quietly(path / "memory.memsw.limit_in_bytes", str(limit_bytes))  # no swap past it
        elif files.version == 2 and (path / "memory.swap.max").exists():
            _write_quietly(path / "memory.swap.max", "0")
    except OSError as exc:
        limit.close()
        raise LimitUnavailable(f"cannot set {path / files.limit}: {exc.strerror}") from None
    return limit


def _parent() -> tuple[Path, _Files]:
    """Where to make children: v2's root when its memory controller reaches children, else v1's
    memory hierarchy at this process's own cgroup."""
    controls = CGROUP_ROOT / "cgroup.subtree_control"
    if controls.is_file():
        if "memory" in controls.read_text().split():
            return CGROUP_ROOT, V2
        raise LimitUnavailable(f"cgroup v2 without the memory controller for children ({controls})")
    memory = CGROUP_ROOT / "memory"
    if (memory / "memory.limit_in_bytes").is_file():
        own = ""
        try:
            for line in PROC_CGROUP.read_text().splitlines():
                _, controllers, path = line.split(":", 2)
                if "memory" in controllers.split(","):
                    own = path.lstrip("/")
        except (OSError, ValueError):
            pass
        return memory / own, V1
    raise LimitUnavailable(f"no cgroup memory controller at {CGROUP_ROOT} (neither v2 nor a v1 'memory')")


def _write_quietly(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError:
        pass
