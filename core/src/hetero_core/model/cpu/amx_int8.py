"""Block-code linears with int8 activations on AMX-INT8 tiles, where the CPU has them and Linux grants them.

``q8a_coded_linear`` (``code_activations = "int8"``) sums int8 activation codes against a GGUF's weight
codes exactly in integers, then scales per block in a fixed order. ``csrc/q8a_coded_linear_amx.c`` runs
those sums on AMX-INT8 tiles (TDPBSUD: 16 rows x 16 columns x 32 inputs per instruction) and the
epilogue as the vector path writes it, so a call on tiles gives the vector path's bits exactly: the
choice is per call, by its rows (``TILE_ROWS`` and more: the tiles; fewer: VNNI), and a row's result
still does not depend on its batch-mates.

The tiles are compiled into every variant of the kernels library wherever ``-march=native`` targets
AMX-INT8 (they change no result, so unlike the bf16 AMX linear they need no variant of their own, and
every dtype candidate, fp32 or bf16, gets them). ``int8_code_tiles(kernels)`` is the gate, once per
library: int8 code activations asked for, the build's tiles (none: nothing to say), the CPU's flags
(``amx_tile``, ``amx_int8``; missing: silently the vector path), Linux's grant
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``) and a self-check: the tiles' results equal
the vector path's bit for bit on shapes covering every code format, partial row blocks, bias,
SwiGLU and bf16. A failure costs one warning, ``executor.amx_int8_unavailable``, and the vector path.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from hetero_core.logging import get_logger
from hetero_core.model.cpu.code_panels import SuperScales, pack_codes
from hetero_core.model.cpu.cpu_info import cpu_flags

log = get_logger("hetero.executor")

AMX_INT8_CPU_FLAGS = ("amx_tile", "amx_int8")
# Calls of this many rows or more sum on tiles. Op level on the 2-vCPU Xeon (docs/benchmarks.md, GGUF):
# below 16 rows a tile is mostly padding and VNNI's 4-row passes are as fast or faster.
TILE_ROWS = 16
# (format, rows, outputs, inputs, swiglu, bias, x and output dtype): one partial block of rows, a full
# one and one over a block boundary, each format, a SwiGLU pair and bf16
SELF_CHECK = (
    ("q4", 17, 48, 96, False, True, torch.float32),
    ("q8", 33, 32, 64, True, False, torch.bfloat16),
    ("q8_sub16", 16, 16, 160, False, True, torch.float32),
    ("q4_f16", 18, 16, 64, False, False, torch.float32),
    ("q8_f16", 16, 32, 96, True, True, torch.float32),
    ("q4_super", 17, 32, 512, True, True, torch.bfloat16),
    ("q8_sub16_super", 20, 16, 256, False, True, torch.float32),
)
_checked: dict[Path, bool] = {}  # library path -> its tiles passed the gate


def int8_code_tiles(kernels):
    """``kernels`` with ``code_tile_rows = TILE_ROWS`` where its block-code linears take int8 activations
    and its library's AMX-INT8 tiles pass the gate; else ``kernels`` as they are."""
    if kernels is None or not kernels.int8_code_activations or kernels.code_tile_rows:
        return kernels
    if kernels.path not in _checked:
        _checked[kernels.path] = _gate(kernels)
    return dataclasses.replace(kernels, code_tile_rows=TILE_ROWS) if _checked[kernels.path] else kernels


def _gate(kernels) -> bool:
    build = kernels.library.q8a_tiles_build()  # 0: no tiles compiled, 1: AMX-INT8, 2: emulated (tests)
    if build == 0 or (build == 1 and any(flag not in cpu_flags() for flag in AMX_INT8_CPU_FLAGS)):
        return False  # most CPUs: nothing to say
    if kernels.library.q8a_tiles_request() != 0:
        return _unavailable(
            "Linux refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM XFEATURE_XTILEDATA; "
            "Linux >= 5.16 grants it)"
        )
    problem = self_check(kernels)
    if problem is not None:
        return _unavailable(f"the tiles failed their self-check: {problem}")
    log.info("executor.amx_int8", applies=True, tile_rows=TILE_ROWS, emulated=build == 2)
    return True


def _unavailable(reason: str) -> bool:
    log.warning("executor.amx_int8_unavailable", reason=reason, fallback="vector int8 code linears")
    return False


def self_check(kernels) -> str | None:
    """None when ``kernels``' int8 code linear gives the same bits on tiles (every row count) as on its
    vector path for ``SELF_CHECK``'s shapes; else what differed."""
    tiles = dataclasses.replace(kernels, code_tile_rows=1)
    plain = dataclasses.replace(kernels, code_tile_rows=0)
    generator = torch.Generator().manual_seed(0)
    for fmt, rows, outputs, inputs, swiglu, with_bias, dtype in SELF_CHECK:
        packed = _random_codes(fmt, outputs, inputs, generator)
        x = torch.randn(rows, inputs, generator=generator).to(dtype)
        bias = torch.randn(outputs, generator=generator) if with_bias else None
        try:
            got = tiles.q8a_coded_linear(x, packed, bias, swiglu=swiglu, out_dtype=dtype)
            expected = plain.q8a_coded_linear(x, packed, bias, swiglu=swiglu, out_dtype=dtype)
        except (ValueError, RuntimeError, MemoryError) as exc:
            return f"{fmt} {rows} x {inputs} -> {outputs}: {exc}"
        if not torch.equal(got, expected):
            error = (got.double() - expected.double()).abs().max().item()
            swiglu_note = " (SwiGLU)" if swiglu else ""
            return f"{fmt} {rows} x {inputs} -> {outputs}{swiglu_note}: differs by {error:.3g}"
    return None


def _random_codes(fmt: str, outputs: int, inputs: int, generator: torch.Generator) -> torch.Tensor:
    """A packed weight of random codes in ``fmt`` (the codes' full ranges, random scales)."""
    sub16, four, supers = fmt.startswith("q8_sub16"), fmt.startswith("q4"), fmt.endswith("_super")
    block = 16 if sub16 else 32
    blocks = inputs // block
    if supers:  # k-quant scales: f16 bases times integer factors per block
        per, count = 256 // block, inputs // 256
        d_base = (torch.rand(outputs, count, generator=generator) * 1e-3).half().float()
        low = -128 if sub16 else 0
        d_factors = torch.randint(low, low + 256 if sub16 else 64, (outputs, count, per), generator=generator)
        d_factors = d_factors.to(torch.int8 if sub16 else torch.uint8)
        m_base = m_factors = None
        if four:
            m_base = -(torch.rand(outputs, count, generator=generator) * 1e-2).half().float()
            m_factors = torch.randint(0, 64, (outputs, count, per), generator=generator).to(torch.uint8)
        scales = SuperScales(d_base, d_factors, m_base, m_factors)
        d, m = scales.expanded()
    else:
        scales = None
        d = torch.rand(outputs, blocks, generator=generator) * 1e-2
        m = -torch.rand(outputs, blocks, generator=generator) * 0.1 if four else torch.zeros(outputs, blocks)
        if fmt.endswith("_f16"):
            d, m = d.half().float(), m.half().float()
    low, high = (0, 16) if four else (-128, 128)
    q = torch.randint(low, high, (outputs, blocks, block), generator=generator)
    return pack_codes(d, m, q.to(torch.uint8 if four else torch.int8), scales)
