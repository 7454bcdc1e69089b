"""What ``/proc/cpuinfo`` says of this CPU: its instruction-set flags and model name (empty where the
file does not exist: macOS, Windows).

Two readers of the flags, for two questions. ``cpu_flags()`` is what the executor *decides* by (the
dtype candidates, the AMX gate, the settings' warnings, the dtype records' keys): this CPU's, or
``$HETERO_CPU_FLAGS`` where set (read here and nowhere else), so the tests, or a person, can see
another CPU's decisions on this one. ``hardware_cpu_flags()`` is what this CPU *runs*: the kernels'
build key and the test builds' "can this code run here". A reported flag never makes code run that
this CPU lacks: the AMX tiles still need the kernel's grant (``amx.py``), which a CPU without AMX
refuses.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
CPU_FLAGS_ENV = "HETERO_CPU_FLAGS"  # flags to report instead of this CPU's: space- or comma-separated
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # the flags of a CPU that computes bf16 natively


def cpu_flags() -> frozenset[str]:
    """The flags the executor decides by: ``$HETERO_CPU_FLAGS`` where set, else ``hardware_cpu_flags()``."""
    reported = os.environ.get(CPU_FLAGS_ENV)
    if reported is not None:
        return frozenset(reported.replace(",", " ").split())
    return hardware_cpu_flags()


@cache
def hardware_cpu_flags() -> frozenset[str]:
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
