"""What went wrong in a tensor-parallel group, in one line naming the rank.

When a step fails, every rank fails with it: the rank that broke (an exception, an exit, or killed)
and the ranks whose collectives then lost a peer. The cause is, in this order: a worker killed by a
signal (or, for a Ray actor, one that died without a word: Ray's death cause says how); else the
worker that reported an exception first; else a worker that exited without a word; else rank 0's own
error (``otherwise``). A worker that died or exited is quoted by its last stderr
line, when it wrote one (a fatal error's message, say).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class WorkerReport:
    """What rank 0 learnt about one worker after a failure."""

    rank: int
    exitcode: int | None = None  # None: still running (or not known to have exited)
    error_time: float | None = None  # when it reported an exception (its clock: same machine)
    summary: str | None = None  # "ValueError: ..." (first line)
    traceback: str | None = None
    last_stderr_line: str | None = None  # what it last wrote to stderr before it died or exited
    death_cause: str | None = None  # a Ray actor's: why Ray says it died (one line)

    @property
    def killed_by(self) -> str | None:
        if self.exitcode is None or self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"


def blame(reports: list[WorkerReport]) -> WorkerReport | None:
    """The worker that caused the failure, or None when none did (rank 0's own error)."""
    killed = [r for r in reports if r.killed_by is not None or (r.death_cause and r.summary is None)]
    errors = sorted((r for r in reports if r.summary is not None), key=lambda r: (r.error_time, r.rank))
    exited = [r for r in reports if r.exitcode is not None]
    return (killed or errors or exited or [None])[0]


def tensor_parallel_worker(rank: int) -> str:
    return f"tensor-parallel worker rank {rank}"


def describe_failure(
    reports: list[WorkerReport], otherwise: str, name: Callable[[int], str] = tensor_parallel_worker
) -> str:
    """One line: which rank failed (``name(rank)``: ``tensor-parallel worker rank 1``) and how;
    ``otherwise`` when no worker is to blame (rank 0's error)."""
    culprit = blame(reports)
    if culprit is None:
        return otherwise.splitlines()[0]
    if culprit.death_cause is not None and culprit.summary is None:
        return f"{name(culprit.rank)} died: {culprit.death_cause}"
    if culprit.killed_by is not None:
        return f"{name(culprit.rank)} died: killed by {culprit.killed_by}{_last_words(culprit)}"
    if culprit.summary is not None:
        return f"{name(culprit.rank)} failed: {culprit.summary}"
    return f"{name(culprit.rank)} exited with code {culprit.exitcode}{_last_words(culprit)}"


def _last_words(report: WorkerReport) -> str:
    return f" (its last stderr line: {report.last_stderr_line!r})" if report.last_stderr_line else ""
