"""Resident memory of a benchmark's engines, from ``/proc`` (Linux; None elsewhere).

Hetero runs in the benchmark's own process (its RSS also holds the harness and any in-process peer:
HF ``generate``); vLLM runs in a worker's process group (the worker, its engine core and workers),
whose members' RSS are summed. RSS counts the pages touched: Hetero's prepared weights are a
memory-mapped file (its pages count once touched, and the page cache shares them between
processes), vLLM's weights are anonymous memory.
"""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def process_rss_mb(pid: int | str = "self") -> float | None:
    """``VmRSS`` of one process in MiB; None where it cannot be read."""
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def group_rss_mb(pgid: int) -> float | None:
    """The summed ``VmRSS`` of every process in process group ``pgid``, in MiB; None if none is found."""
    total, found = 0.0, False
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            group = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2])
        except (OSError, ValueError, IndexError):
            continue
        if group == pgid:
            rss = process_rss_mb(entry.name)
            if rss is not None:
                total, found = total + rss, True
    return total if found else None
