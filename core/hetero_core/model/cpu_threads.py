"""How many CPU threads torch may use, and how its OpenMP threads wait.

Two things made generation ~6x slower when one other busy process shared the 2-core machine:
- torch's default intra-op thread count is the machine's core count, not the CPUs this process
  is allowed to run on (``taskset``, cgroup cpusets); we size it from ``os.sched_getaffinity``;
- OpenMP threads spin at the end of every parallel region (libgomp's default wait policy). A
  thread that shares its core with another process burns its time slice spinning while the
  thread it waits for is descheduled. ``OMP_WAIT_POLICY=PASSIVE`` makes waiting threads sleep.
  libgomp reads it once, when torch loads it, so ``prefer_passive_openmp_wait`` must run before
  ``import torch``; ``hetero_core.model`` calls it on import. A policy the user set is kept.
"""

from __future__ import annotations

import os
import sys

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def prefer_passive_openmp_wait() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless it is set or torch is already loaded; True if set."""
    if WAIT_POLICY_ENV in os.environ or "torch" in sys.modules:
        return False
    os.environ[WAIT_POLICY_ENV] = "PASSIVE"
    return True


def intra_op_threads(requested: int | None, num_ranks: int = 1) -> int:
    """The executor's ``num_threads`` option, else every CPU this process may use, shared equally
    by the ``num_ranks`` tensor-parallel processes running on them (at least one each)."""
    return requested if requested is not None else max(1, available_cpus() // num_ranks)
