"""How much memory this process may still take: what the kernel would give it before reclaiming
nothing it needs or killing it.

Two limits apply and the smaller one wins: the machine's ``MemAvailable`` (``/proc/meminfo``: free
memory plus the page cache the kernel can drop) and the memory cgroup this process is in (a
container's or a systemd slice's limit minus what the group already uses: cgroup v2's
``memory.max`` and ``memory.current``, or v1's ``memory.limit_in_bytes`` and ``memory.usage_in_bytes``).
A ``dtype = "auto"`` candidate whose weights do not fit here is never loaded (the OOM killer ends a
process over its cgroup limit without a word), and the CPU KV cache is sized from what is left.

No torch: the files are read as text. ``proc`` and ``sys_fs_cgroup`` are parameters so tests run on
fake roots; a file that is missing or unreadable is a limit that is not there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
CGROUP_ROOT = Path("/sys/fs/cgroup")
_V1_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a huge page-aligned number (2^63 - 4096)


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes available to this process, and where the figure comes from (for messages)."""

    available_bytes: int
    source: str  # "MemAvailable", or the cgroup file whose limit is the smaller one

    def describe(self) -> str:
        return f"{format_bytes(self.available_bytes)} available ({self.source})"


def memory_budget(proc: Path = PROC, sys_fs_cgroup: Path = CGROUP_ROOT) -> MemoryBudget | None:
    """The smallest of the limits that apply to this process; None when none can be read (not Linux)."""
    limits = []
    meminfo = mem_available(proc)
    if meminfo is not None:
        limits.append(MemoryBudget(meminfo, "MemAvailable in /proc/meminfo"))
    limits += cgroup_budgets(proc, sys_fs_cgroup)
    return min(limits, key=lambda b: b.available_bytes) if limits else None


def mem_available(proc: Path = PROC) -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (None where it is not there)."""
    text = _read(Path(proc) / "meminfo")
    for line in (text or "").splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "MemAvailable":
            fields = value.split()
            if fields and fields[0].isdigit():
                return int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return None


def cgroup_budgets(proc: Path = PROC, sys_fs_cgroup: Path = CGROUP_ROOT) -> list[MemoryBudget]:
    """Limit minus usage of each memory cgroup this process is in (``/proc/self/cgroup``) that has a
    limit, and of each ancestor of it (a parent's limit binds its children too)."""
    budgets = []
    for line in (_read(Path(proc) / "self" / "cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, group = parts
        if controllers == "":  # v2: one unified hierarchy
            budgets += _walk(Path(sys_fs_cgroup), group, "memory.max", "memory.current")
        elif "memory" in controllers.split(","):  # v1: the memory controller's own hierarchy
            budgets += _walk(
                Path(sys_fs_cgroup) / "memory", group, "memory.limit_in_bytes", "memory.usage_in_bytes"
            )
    return budgets


def _walk(root: Path, group: str, limit_name: str, usage_name: str) -> list[MemoryBudget]:
    budgets = []
    folder = root / group.strip().lstrip("/")
    while True:
        limit = _number(folder / limit_name)
        usage = _number(folder / usage_name)
        if limit is not None and limit < _V1_UNLIMITED:
            budgets.append(MemoryBudget(max(0, limit - (usage or 0)), f"{folder / limit_name} minus usage"))
        if folder == root or root not in folder.parents:
            return budgets
        folder = folder.parent


def _number(path: Path) -> int | None:
    """The file's integer; None for "max" (v2's no limit), a missing file or anything else."""
    text = (_read(path) or "").strip()
    return int(text) if text.isdigit() else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def format_bytes(num_bytes: int) -> str:
    """``num_bytes`` in GiB (MiB under one GiB), for messages."""
    if abs(num_bytes) >= 1 << 30:
        return f"{num_bytes / (1 << 30):.2f} GiB"
    return f"{num_bytes / (1 << 20):.0f} MiB"
