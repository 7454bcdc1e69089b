"""bf16 linears on AMX tiles, where the CPU has them and the kernel grants them.

Intel Xeons since Sapphire Rapids multiply bf16 on AMX tiles (16 x 32 by 32 x 16 per instruction),
several times the AVX-512 BF16 rate: on a 2-core Xeon oneDNN's bf16 matmul ran ~3x its fp32 one.
The kernels' bf16 linear runs there from ``csrc/bf16_linear_amx.c``, compiled into a variant of the
kernels library (``AMX_CFLAGS``; the same sources, its own cached file) whose ``bf16_linear`` takes
every shape onto tiles once the kernel has granted this process the tile data state. It reads the
same packed weights (the AVX-512 panels are AMX's B tiles), so the prepared-weights file is shared.
Every bf16 linear of a process runs on the one variant (fused decode included): batch invariance
holds within it, as within any build (the bits differ from the AVX-512 path's).

``amx_kernels(base)`` is the gate, once per process: the CPU's flags (``amx_tile``, ``amx_bf16``;
none: None, silently), the variant's build, ``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``
(the library's ``amx_request_permission``) and a self-check of its linear against float64 torch on
small shapes that cover its partial row blocks, input tails, bias, fp32 output and SwiGLU. A step
that fails costs one warning, ``executor.amx_unavailable`` with the reason, and the AVX-512 linears
run instead. Where AMX and oneDNN are both there, the executor's ``dtype = "auto"`` times the AMX
variant as a candidate of its own (``bfloat16-amx``, ``default_plugins/torch_auto_dtype.py``).
"""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path

import torch

from hetero_core.logging import get_logger
from hetero_core.model.cpu.amx_int8 import int8_code_tiles
from hetero_core.model.cpu.cpu_info import cpu_flags
from hetero_core.model.cpu.kernels import CpuKernels, KernelUnavailable, load_cpu_kernels

log = get_logger("hetero.executor")

AMX_CPU_FLAGS = ("amx_tile", "amx_bf16")
AMX_CFLAGS = ("-mamx-tile", "-mamx-bf16", "-DHETERO_AMX=1")
# The AMX linear on tiles emulated in C (csrc/amx_emulation.h): its blocking and outputs, tested on any CPU
AMX_EMULATED_CFLAGS = ("-DHETERO_AMX=1", "-DHETERO_AMX_EMULATED=1")
# (rows, outputs, inputs, swiglu, out_dtype, bias): a partial block of one row, one over a block
# boundary with an input tail (40 pairs: 2 full tiles and 8 pairs), SwiGLU, fp32 outputs
SELF_CHECK = (
    (1, 64, 80, False, torch.bfloat16, True),
    (19, 80, 96, False, torch.float32, True),
    (33, 64, 70, True, torch.bfloat16, False),
    (16, 16, 0, False, torch.float32, True),
)
TOLERANCE = 0.02  # of the largest |reference|: bf16 outputs round at 2^-8 relative


def amx_kernels(base: CpuKernels) -> CpuKernels | None:
    """``base``'s AMX variant (``amx=True``, ``base``'s other settings, its AMX-INT8 code tiles where
    ``base`` has them and the variant's pass their own gate) where this CPU has AMX, the variant
    builds, the kernel grants the tiles and its linear passes the self-check; None otherwise."""
    variant = _variant(base.path.parent.parent)  # built into the base library's cache
    if variant is None:
        return None
    variant = dataclasses.replace(
        variant, block_codes=base.block_codes, code_activations=base.code_activations, code_tile_rows=0
    )
    return int8_code_tiles(variant) if base.code_tile_rows else variant  # base's AMX-INT8 tiles too


@cache
def _variant(cache_dir: Path) -> CpuKernels | None:
    missing = [flag for flag in AMX_CPU_FLAGS if flag not in cpu_flags()]
    if missing:
        return None  # most CPUs: nothing to say
    try:
        variant = load_cpu_kernels(required=True, extra_flags=AMX_CFLAGS, cache_dir=cache_dir)
    except KernelUnavailable as exc:
        return _unavailable(f"the AMX build of the kernels failed: {exc}")
    if not variant.request_amx():
        return _unavailable(
            "the kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM "
            "XFEATURE_XTILEDATA; Linux >= 5.16 grants it)"
        )
    problem = self_check(variant)
    if problem is not None:
        return _unavailable(f"the AMX linear failed its self-check: {problem}")
    log.info("executor.amx", applies=True, path=str(variant.path))
    return dataclasses.replace(variant, amx=True)


def _unavailable(reason: str) -> None:
    log.warning("executor.amx_unavailable", reason=reason, fallback="AVX-512 bf16 linears")
    return None


def self_check(kernels) -> str | None:
    """None when ``kernels.bf16_linear`` matches float64 torch within ``TOLERANCE`` on ``SELF_CHECK``'s
    shapes; else what differed."""
    generator = torch.Generator().manual_seed(0)
    for rows, outputs, inputs, swiglu, out_dtype, with_bias in SELF_CHECK:
        weight = (torch.randn(outputs, inputs, generator=generator) * 0.1).bfloat16()
        x = torch.randn(rows, inputs, generator=generator).bfloat16()
        bias = torch.randn(outputs, generator=generator) if with_bias else None
        try:
            packed = kernels.pack_bf16_linear(weight, swiglu=swiglu)
            if packed is None:
                return f"{rows} x {inputs} -> {outputs}: the kernels' bf16 layout refused the weight"
            got = kernels.bf16_linear(x, packed, bias, out_dtype=out_dtype, swiglu=swiglu).double()
        except (ValueError, RuntimeError) as exc:
            return f"{rows} x {inputs} -> {outputs}: {exc}"
        reference = x.double() @ weight.double().T + (bias.double() if bias is not None else 0)
        if swiglu:
            gate, up = reference.chunk(2, dim=-1)
            reference = torch.nn.functional.silu(gate) * up
        scale = max(reference.abs().max().item() if reference.numel() else 0.0, 1.0)
        error = (got - reference).abs().max().item() if got.numel() else 0.0
        if got.shape != reference.shape or not error <= TOLERANCE * scale:  # NaN fails too
            return (
                f"{rows} x {inputs} -> {outputs}{' (SwiGLU)' if swiglu else ''}: max error {error:.3g} "
                f"against {scale:.3g}"
            )
    return None
