"""The compiled CPU kernels built for narrower vector ISAs than this CPU's, so every width's code runs
in the tests on any x86 machine: SSE (``x86-64``, 4 lanes), AVX without AVX2 or FMA (``sandybridge``,
8 lanes), AVX2 with FMA (``haswell``), AVX-512 without AVX-512 BF16 (``skylake-avx512``, 16 lanes, the
bf16 linear widening its weight), this CPU's own (``native``, the engine's), and ``amx-emulated``:
this CPU's with the AMX variant's bf16 linear (``csrc/bf16_linear_amx.c``) on tiles emulated in C
(``csrc/amx_emulation.h``), so its blocking, tails and outputs are tested on any CPU, and the int8
code linear's sums on emulated AMX-INT8 tiles from ``EMULATED_TILE_ROWS`` rows (the vector path
below: every suite that runs this build mixes the two paths by row count). The other
builds are cached per test session in a temporary directory, never in ~/.cache/hetero."""

from __future__ import annotations

import dataclasses
import platform
from pathlib import Path

import pytest

from hetero_core.model.cpu import kernels as cpu_kernels_module
from hetero_core.model.cpu.amx import AMX_EMULATED_CFLAGS
from hetero_core.model.cpu.cpu_info import hardware_cpu_flags
from hetero_core.model.cpu.kernels import CpuKernels, KernelUnavailable, load_cpu_kernels

BUILDS = ("native", "x86-64", "sandybridge", "haswell", "skylake-avx512", "amx-emulated")
NARROW_BUILDS = BUILDS[1:5]  # narrower vectors than AVX-512 BF16's
_NEEDS = {
    "x86-64": set(),
    "sandybridge": {"avx"},
    "haswell": {"avx2", "fma", "bmi2"},
    "skylake-avx512": {"avx2", "fma", "bmi2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"},
}
EMULATED_TILE_ROWS = 4  # amx-emulated: q8a_coded_linear calls of 4 rows or more on (emulated) tiles
_built: dict[str, CpuKernels] = {}


def kernels_for(build: str, cache_dir: Path) -> CpuKernels:
    """The kernels compiled with ``-march=<build>`` (``native``: as the engine builds them); skips the
    test where this machine cannot build or run them."""
    if build in _built:
        return _built[build]
    if build == "native":  # the engine's own build, from its cache
        try:
            return load_cpu_kernels(required=True)
        except KernelUnavailable as exc:
            pytest.skip(f"the CPU kernels cannot be built here: {exc}")
    if build == "amx-emulated":
        try:
            kernels = load_cpu_kernels(required=True, extra_flags=AMX_EMULATED_CFLAGS)
        except KernelUnavailable as exc:
            pytest.skip(f"the CPU kernels cannot be built here: {exc}")
        if not kernels.request_amx():  # emulated: granted without asking the kernel
            raise AssertionError("the emulated AMX build refused its (emulated) tiles")
        _built[build] = dataclasses.replace(kernels, amx=True, code_tile_rows=EMULATED_TILE_ROWS)
        return _built[build]
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 -march values")
    missing = _NEEDS[build] - hardware_cpu_flags()  # what runs here, never the reported flags
    if missing:
        pytest.skip(f"this CPU cannot run code built for {build} (no {', '.join(sorted(missing))})")
    flags = tuple(
        f"-march={build}" if flag == "-march=native" else flag for flag in cpu_kernels_module.CFLAGS
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HETERO_CACHE_DIR", str(cache_dir))
        patch.setattr(cpu_kernels_module, "CFLAGS", flags)
        cpu_kernels_module._load.cache_clear()
        try:
            _built[build] = load_cpu_kernels(required=True)
        except KernelUnavailable as exc:
            pytest.skip(f"the CPU kernels cannot be built here: {exc}")
        finally:
            cpu_kernels_module._load.cache_clear()  # the next load_cpu_kernels() is the engine's own again
    return _built[build]
