"""How many CPU threads torch may use, and how its OpenMP threads wait.

Two things made generation ~6x slower when one other busy process shared the 2-core machine:
- torch's default intra-op thread count is the machine's core count, not the CPUs this process
  is allowed to run on (``taskset``, cgroup cpusets); we size it from ``os.sched_getaffinity``;
- OpenMP threads spin at the end of every parallel region (libgomp's default wait policy: up to
  300,000 spins). A thread that shares its core with another process burns its time slice
  spinning while the thread it waits for is descheduled. ``OMP_WAIT_POLICY=PASSIVE`` makes
  waiting threads sleep.

Sleeping has its own price where the cores are ours alone: every parallel region (~200 per decode
step: the linears, attention, the larger element-wise kernels) first wakes the sleeping thread,
~35 us each on our 2-core VMs, so decoding was ~1.3x slower than with a short spin (bf16 workload,
AVX-512 EPYC: 62 decode steps 2.0 s asleep, 1.4-1.55 s spinning), while a short spin beside one
busy process cost 1.6x (4.1 s against 2.5 s asleep) and libgomp's default spin 2.2x. So
``choose_openmp_wait`` looks before torch loads: if this process's CPUs are idle it sets a short
spin (``GOMP_SPINCOUNT``), otherwise ``OMP_WAIT_POLICY=PASSIVE``. A spin is counted in PAUSE
instructions, whose length varies: 3,000 were 39 us on an Emerald Rapids Xeon, shorter than some
of the Python between two kernels, and its fp32 workload ran 4-6 % faster with 10,000-30,000
(emulated AVX2: 7.3-7.7 s against 7.85-8.05 s); SHORT_SPIN is 20,000 (~0.26 ms there). libgomp
reads both once, when torch loads it (torch's bundled libgomp, which the compiled kernels share), so
the choice is made where the CPU runtime starts, before that path imports torch: the torch executor's
factory on a CPU device (the builder imports no torch before it), and tensor parallelism's rank 0 and
workers. A process that loaded torch earlier (a script that imported it, a first start that converts
a GGUF) keeps libgomp's defaults; GPU executors never choose. A policy the user set (either
variable) is kept: ``OMP_WAIT_POLICY=PASSIVE`` always sleeps, ``GOMP_SPINCOUNT=N`` spins N.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
SPIN_COUNT_ENV = "GOMP_SPINCOUNT"
SHORT_SPIN = "20000"  # libgomp spins (PAUSE loops) before sleeping: ~0.26 ms on an Emerald Rapids Xeon
IDLE_SAMPLE_S = 0.03
PROC_STAT = Path("/proc/stat")


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def choose_openmp_wait(device: str = "cpu") -> str | None:
    """Set a short spin (CPUs idle) or ``OMP_WAIT_POLICY=PASSIVE`` (CPUs busy) before torch loads,
    for an executor that runs on ``device`` (a torch device name); return what was set (``"spin"``,
    ``"passive"``), None where the device is not the CPU, the user chose or torch is loaded."""
    if not is_cpu_device(device):
        return None
    if WAIT_POLICY_ENV in os.environ or SPIN_COUNT_ENV in os.environ or "torch" in sys.modules:
        return None
    if cpus_are_idle():
        os.environ[SPIN_COUNT_ENV] = SHORT_SPIN
        return "spin"
    os.environ[WAIT_POLICY_ENV] = "PASSIVE"
    return "passive"


def is_cpu_device(device: str) -> bool:
    """True for ``"cpu"`` (or ``"cpu:0"``): read without torch, which must not load yet."""
    return str(device).partition(":")[0].strip().lower() == "cpu"


def cpus_are_idle(sample_s: float = IDLE_SAMPLE_S) -> bool:
    """True when, over ``sample_s``, the machine's CPUs were busy for less than half a CPU in all
    (``/proc/stat``), i.e. no other process is running on them. False where it cannot tell."""
    before = _busy_and_total_ticks()
    time.sleep(sample_s)
    busy_cpus = _busy_cpus(before, _busy_and_total_ticks())
    return busy_cpus is not None and busy_cpus < 0.5


def _busy_cpus(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """How many CPUs were busy between two ``_busy_and_total_ticks`` samples; None where unknown."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1]) * (os.cpu_count() or 1)


def _busy_and_total_ticks() -> tuple[int, int] | None:
    """The ``cpu`` line of ``/proc/stat``: (ticks not idle or waiting for I/O, all ticks)."""
    try:
        fields = PROC_STAT.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(value) for value in fields[1:]]
    idle = sum(ticks[3:5])  # idle, iowait
    return sum(ticks) - idle, sum(ticks)


class FreeCpuThreads:
    """Intra-op threads that follow the CPUs other processes leave free, re-measured at most every
    ``interval_s`` (the executor calls ``update`` before each step).

    Other processes' load is the machine's busy time (``/proc/stat``) minus this process's own CPU
    time over the same interval, in CPUs: with one busy neighbour on 2 CPUs the executor drops to
    one thread (which then never waits on a descheduled partner, spinning or asleep), and goes back
    to two when the neighbour stops. An interval longer than ``stale_s`` (the engine sat idle, and
    whatever ran meanwhile, a benchmark's other contender say, may be gone) only starts a new one.
    Measured with ``bench/busy_cpu_throughput.py`` (batch 1, AVX-512 EPYC, short spin): beside a
    busy process 33.6 tok/s with two threads always, 83.4 with this (99.5 idle)."""

    def __init__(
        self,
        max_threads: int,
        set_threads,
        interval_s: float = 0.25,
        stale_s: float = 1.0,
        clock=time.monotonic,
        cpu_time=time.process_time,
    ):
        self.max_threads = self.threads = max_threads
        self._set_threads, self._interval_s, self._clock, self._cpu_time = (
            set_threads,
            interval_s,
            clock,
            cpu_time,
        )
        self._stale_s = stale_s  # a longer interval spans a pause of the engine: what ran then says nothing
        self._last = self._sample()

    def update(self) -> int:
        """Re-measure if ``interval_s`` has passed; return the thread count now in use."""
        if self._clock() - self._last[0] < self._interval_s:
            return self.threads
        sample = self._sample()
        (wall0, cpu0, ticks0), (wall1, cpu1, ticks1) = self._last, sample
        self._last = sample
        machine_busy = _busy_cpus(ticks0, ticks1)
        if machine_busy is None or not 0 < wall1 - wall0 <= self._stale_s:
            return self.threads
        others = max(0.0, machine_busy - (cpu1 - cpu0) / (wall1 - wall0))
        threads = max(1, min(self.max_threads, self.max_threads - round(others)))
        if threads != self.threads:
            self._set_threads(threads)
            self.threads = threads
        return threads

    def _sample(self) -> tuple[float, float, tuple[int, int] | None]:
        return self._clock(), self._cpu_time(), _busy_and_total_ticks()


def intra_op_threads(requested: int | None, num_ranks: int = 1) -> int:
    """The executor's ``num_threads`` option, else every CPU this process may use, shared equally
    by the ``num_ranks`` tensor-parallel processes running on them (at least one each)."""
    return requested if requested is not None else max(1, available_cpus() // num_ranks)
