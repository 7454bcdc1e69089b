"""Resident memory of a benchmark's engines, from ``/proc`` (Linux; None elsewhere).

Hetero runs in the benchmark's own process (its RSS also holds the harness and any in-process peer:
HF ``generate``); vLLM runs in a worker's process group (the worker, its engine core and workers),
whose members' RSS are summed (with the processes they start in sessions of their own: a
tensor-parallel engine's worker ranks). RSS counts the pages touched: Hetero's prepared weights are a
memory-mapped file (its pages count once touched, and the page cache shares them between
processes), vLLM's weights are anonymous memory.

Peaks (``hetero bench memory``): ``VmHWM`` is one process's own high-water mark, and a group's sum of
them over-counts when its members peak at different times (and misses members already gone), so a
``PeakSampler`` also samples the group's summed RSS every few milliseconds and keeps the largest.
"""

from __future__ import annotations

import threading
from pathlib import Path

PROC = Path("/proc")


def process_rss_mb(pid: int | str = "self") -> float | None:
    """``VmRSS`` of one process in MiB; None where it cannot be read."""
    return _status_mb(pid, "VmRSS:")


def process_hwm_mb(pid: int | str = "self") -> float | None:
    """``VmHWM`` (peak RSS) of one process in MiB; None where it cannot be read."""
    return _status_mb(pid, "VmHWM:")


def group_rss_mb(pgid: int) -> float | None:
    """The summed ``VmRSS`` of every process in process group ``pgid`` (and its descendants elsewhere:
    ``group_pids``), in MiB; None if none is found."""
    return _group_sum(pgid, process_rss_mb)


class PeakSampler:
    """The largest summed RSS of process group ``pgid`` seen, sampled every ``interval_s`` on a thread
    from ``start()`` to ``stop()`` (which returns it, in MiB; None if never read)."""

    def __init__(self, pgid: int, interval_s: float = 0.05) -> None:
        self.pgid, self.interval_s = pgid, interval_s
        self.peak_mb: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)

    def start(self) -> PeakSampler:
        self._thread.start()
        return self

    def stop(self) -> float | None:
        self._done.set()
        self._thread.join()
        return self.peak_mb

    def _sample(self) -> None:
        while True:
            rss = group_rss_mb(self.pgid)
            if rss is not None and (self.peak_mb is None or rss > self.peak_mb):
                self.peak_mb = rss
            if self._done.wait(self.interval_s):
                return


def _status_mb(pid: int | str, key: str) -> float | None:
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def group_hwm_each_mb(pgid: int) -> list[float]:
    """The ``VmHWM`` of each process now in group ``pgid`` (``group_pids``), in MiB, largest first (a
    tensor-parallel run's ranks: each rank's own peak, which the group's sum hides)."""
    return sorted(_group_values(pgid, process_hwm_mb), reverse=True)


def _group_sum(pgid: int, per_process) -> float | None:
    values = _group_values(pgid, per_process)
    return sum(values) if values else None


def _group_values(pgid: int, per_process) -> list[float]:
    values = [per_process(pid) for pid in group_pids(pgid)]
    return [value for value in values if value is not None]


def group_pids(pgid: int) -> list[int]:
    """The processes of group ``pgid`` and their descendants in sessions of their own (a tensor-parallel
    engine's workers start with ``start_new_session``: rank 0's group does not hold them)."""
    parents, members = {}, set()
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents[int(entry.name)] = int(fields[1])
            if int(fields[2]) == pgid:
                members.add(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    found, grown = set(members), True
    while grown:  # the descendants, generation by generation
        more = {pid for pid, parent in parents.items() if parent in found and pid not in found}
        found |= more
        grown = bool(more)
    return sorted(found)
