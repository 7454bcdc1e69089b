"""What ``/proc/cpuinfo`` says of this CPU: its instruction-set flags and model name (empty where the
file does not exist: macOS, Windows). Read by the kernel build (its cache key), the dtype choice and
the benchmarks' machine description."""

from __future__ import annotations

from functools import cache
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # the flags of a CPU that computes bf16 natively


@cache
def cpu_flags() -> frozenset[str]:
    """The ``flags`` of the first CPU in ``/proc/cpuinfo``; empty where there is none (macOS, Windows)."""
    return frozenset(_cpuinfo_field("flags").split())


def cpu_model_name() -> str:
    """The ``model name`` of the first CPU in ``/proc/cpuinfo``; empty where there is none."""
    return _cpuinfo_field("model name").strip()


def _cpuinfo_field(name: str) -> str:
    try:
        text = CPUINFO.read_text(errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value
    return ""
