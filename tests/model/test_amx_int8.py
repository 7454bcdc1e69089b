"""The int8 code linear on AMX-INT8 tiles (``csrc/q8a_coded_linear_amx.c``): on emulated tiles
(``amx-emulated``, any CPU) its results are the vector path's bit for bit (the base library's VNNI,
AVX2 or int32 sums) for every format, row count, input width, bias, SwiGLU and dtype; its gate
(``model/cpu/amx_int8.py``) falls back with one warning at whichever step fails; and an executor with
``code_activations = "int8"`` runs its block-code linears on the tiles with the same logits. Nothing
here depends on this CPU's flags: the one test of the real tiles skips where the build has none."""

from __future__ import annotations

import ctypes
import dataclasses
import logging

import pytest
import torch

from hetero_core.default_plugins import torch_executor
from hetero_core.default_plugins.torch_options import TorchExecutorOptions
from hetero_core.model.cpu import amx_int8
from tests.model.kernel_builds import kernels_for
from tests.model.q8a_reference import FORMATS, pack_codes, random_codes

AMX_INT8_FLAGS = frozenset({"avx512f", "avx512_vnni", "amx_tile", "amx_int8"})


@pytest.fixture(autouse=True)
def fresh_gate():
    amx_int8._checked.clear()
    yield
    amx_int8._checked.clear()


@pytest.fixture
def emulated(tmp_path_factory):
    kernels = kernels_for("amx-emulated", tmp_path_factory.getbasetemp() / "kernel_builds")
    return dataclasses.replace(kernels, code_tile_rows=1)  # every call on tiles


def _x(rows: int, in_features: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features + 16, generator=g)[:, 8 : 8 + in_features]  # strided rows
    x[:, 32:64] = 0.0  # an all-zero block: scale 0
    return x


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 5, 16, 17, 32, 33, 70])  # partial and whole tile blocks, chunks
@pytest.mark.parametrize("in_features", [96, 224])  # 3 and 7 blocks (14 of 16 inputs for q8_sub16)
@pytest.mark.parametrize("out_features, bias", [(48, True), (32, False)])  # 48: a group of one panel
def test_tiles_give_the_vector_paths_bits(cpu_kernels, emulated, fmt, rows, in_features, out_features, bias):
    d, m, q, packed = random_codes(fmt, out_features, in_features, seed=rows + in_features)
    bias = torch.randn(out_features) if bias else None
    x = _x(rows, in_features, seed=out_features)
    for x_dtype in (torch.float32, torch.bfloat16):
        for out_dtype in (torch.float32, torch.bfloat16):
            tiles = emulated.q8a_coded_linear(x.to(x_dtype), packed, bias, out_dtype=out_dtype)
            vector = cpu_kernels.q8a_coded_linear(x.to(x_dtype), packed, bias, out_dtype=out_dtype)
            assert tiles.shape == (rows, out_features) and tiles.dtype == out_dtype
            assert torch.equal(tiles, vector), (x_dtype, out_dtype)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [3, 16, 40])
def test_the_swiglu_epilogue_on_tiles_gives_the_vector_paths_bits(cpu_kernels, emulated, fmt, rows):
    d, m, q, _ = random_codes(fmt, 96, 128, seed=rows)
    order = cpu_kernels.swiglu_order
    fused = pack_codes(order(d), None if m is None else order(m), order(q))
    bias = order(torch.randn(96))
    x = _x(rows, 128, seed=rows)
    for dtype in (torch.float32, torch.bfloat16):
        tiles = emulated.q8a_coded_linear(x.to(dtype), fused, bias, swiglu=True, out_dtype=dtype)
        vector = cpu_kernels.q8a_coded_linear(x.to(dtype), fused, bias, swiglu=True, out_dtype=dtype)
        assert tiles.shape == (rows, 48) and torch.equal(tiles, vector)


def test_a_call_below_the_tile_rows_runs_the_vector_path(cpu_kernels, emulated):
    """``code_tile_rows`` picks the path per call; either way a row gets the same bits."""
    _, _, _, packed = random_codes("q4", 32, 64)
    x = _x(40, 64, seed=1)
    alone = torch.cat([cpu_kernels.q8a_coded_linear(x[r : r + 1], packed, None) for r in range(40)])
    mixed = dataclasses.replace(emulated, code_tile_rows=8)
    for rows in (1, 7, 8, 9, 40):
        assert torch.equal(mixed.q8a_coded_linear(x[:rows], packed, None), alone[:rows]), rows


def test_the_hardware_tiles_give_the_vector_paths_bits(cpu_kernels):
    if cpu_kernels.library.q8a_tiles_build() != 1:
        pytest.skip("this build has no AMX-INT8 tiles (the compiler's -march=native does not target them)")
    if cpu_kernels.library.q8a_tiles_request() != 0:
        pytest.skip("Linux refused the AMX tile state here")
    assert amx_int8.self_check(cpu_kernels) is None
    tiles = dataclasses.replace(cpu_kernels, code_tile_rows=1)
    for fmt in FORMATS:
        _, _, _, packed = random_codes(fmt, 64, 256, seed=2)
        x = _x(37, 256, seed=3)
        expected = cpu_kernels.q8a_coded_linear(x, packed, None)
        assert torch.equal(tiles.q8a_coded_linear(x, packed, None), expected)


class _Library:
    """A kernels library that reports a hardware tile build, grants or refuses as told, and may corrupt
    its tile results (a broken build); every other call the real library's."""

    def __init__(self, real, *, grant: bool = True, corrupt: bool = False):
        self.real, self.grant, self.corrupt = real, grant, corrupt

    def q8a_tiles_build(self) -> int:
        return 1

    def q8a_tiles_request(self) -> int:
        return 0 if self.grant else -1

    def q8a_coded_linear(self, *args):
        status = self.real.q8a_coded_linear(*args)
        if self.corrupt and args[13] > 0:  # tile_rows: the "tiles" answered; flip a bit of y[0]
            ctypes.c_uint8.from_address(args[5]).value ^= 1
        return status

    def __getattr__(self, name):
        return getattr(self.real, name)


def _kernels(real, tmp_path, **library):
    return dataclasses.replace(
        real, library=_Library(real.library, **library), path=tmp_path / "lib.so", code_activations="int8"
    )


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "executor.amx_int8_unavailable" in r.getMessage()]


def test_a_cpu_without_amx_int8_keeps_the_vector_path_silently(cpu_kernels, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(amx_int8, "cpu_flags", lambda: frozenset({"avx512f", "amx_tile", "amx_bf16"}))
    kernels = _kernels(cpu_kernels, tmp_path)
    with caplog.at_level(logging.INFO, logger="hetero"):
        assert amx_int8.int8_code_tiles(kernels).code_tile_rows == 0
    assert _warnings(caplog) == []


def test_float_code_activations_never_ask_for_tiles(cpu_kernels, tmp_path, monkeypatch):
    monkeypatch.setattr(amx_int8, "cpu_flags", lambda: AMX_INT8_FLAGS)
    kernels = dataclasses.replace(_kernels(cpu_kernels, tmp_path, grant=False), code_activations="float")
    assert amx_int8.int8_code_tiles(kernels) is kernels and amx_int8._checked == {}


@pytest.mark.parametrize(
    "library, expected", [({"grant": False}, "arch_prctl"), ({"corrupt": True}, "self-check")]
)
def test_a_refused_grant_or_wrong_bits_fall_back_with_one_warning(
    cpu_kernels, tmp_path, monkeypatch, caplog, library, expected
):
    if not cpu_kernels.int8_code_activations and cpu_kernels.q8a_path == "int32":
        pytest.skip("no vector int8 code linear on this CPU")
    monkeypatch.setattr(amx_int8, "cpu_flags", lambda: AMX_INT8_FLAGS)
    kernels = _kernels(cpu_kernels, tmp_path, **library)
    with caplog.at_level(logging.INFO, logger="hetero"):
        assert amx_int8.int8_code_tiles(kernels).code_tile_rows == 0
        assert amx_int8.int8_code_tiles(kernels).code_tile_rows == 0
    [warning] = _warnings(caplog)
    assert expected in warning


def test_emulated_tiles_pass_the_gate(emulated, caplog):
    """The emulated build needs neither the CPU's flags nor Linux's grant; its tiles pass the self-check."""
    kernels = dataclasses.replace(emulated, code_tile_rows=0, code_activations="int8")
    if not kernels.int8_code_activations:
        pytest.skip("no vector int8 code linear on this CPU (the int32 path)")
    with caplog.at_level(logging.INFO, logger="hetero"):
        assert amx_int8.int8_code_tiles(kernels).code_tile_rows == amx_int8.TILE_ROWS
    assert "executor.amx_int8" in caplog.text and _warnings(caplog) == []


def test_an_int8_executor_runs_its_code_linears_on_the_tiles_with_the_same_logits(
    emulated, make_executor, tmp_path, monkeypatch, caplog
):
    """The emulated build stands in for an AMX-INT8 CPU, on a GGUF of every code format in fp32 and
    bf16: every block-code linear takes the gate's tile rows, and a prompt's logits are the vector
    path's bit for bit."""
    from hetero_core.model.cpu import kernels as cpu_kernels_module
    from hetero_core.model.cpu.linear import PackedLinear
    from hetero_core.model.gguf_cache import ensure_gguf_converted
    from tests.model.gguf_files import mixed_types, write_mixed_gguf
    from tests.model.paged_batches import prompt_logits

    base = dataclasses.replace(emulated, code_tile_rows=0)
    if not dataclasses.replace(base, code_activations="int8").int8_code_activations:
        pytest.skip("no vector int8 code linear on this CPU (the int32 path)")
    monkeypatch.setattr(cpu_kernels_module, "load_cpu_kernels", lambda required=False, **_: base)
    monkeypatch.setattr(torch_executor, "amx_kernels", lambda kernels: None)  # the bf16 tiles: not here
    monkeypatch.setattr(amx_int8, "TILE_ROWS", 4)  # the test's prompt: tiles from 4 rows
    gguf = write_mixed_gguf(tmp_path / "mixed.gguf", mixed_types())
    model_dir = ensure_gguf_converted(gguf, tmp_path / "cache")
    for dtype in ("float32", "bfloat16"):
        logits = {}
        for on in (False, True):
            options = TorchExecutorOptions(
                dtype=dtype,
                cpu_kernels="compiled",
                prepared_weights_cache=False,
                code_activations="int8",
                amx_linears=on,
            )
            with caplog.at_level(logging.INFO, logger="hetero"):
                executor = make_executor(model_dir, options=options)
            modules = executor.model.modules()
            codes = [m for m in modules if isinstance(m, PackedLinear) and m.int8_activations]
            assert {m.kernel_weight.dtype for m in codes} == {torch.uint8, torch.int8}
            assert all(m.kernels.code_tile_rows == (4 if on else 0) for m in codes)
            logits[on] = prompt_logits(executor, list(range(2, 14)))
        assert torch.equal(logits[True], logits[False]), dtype
    assert "amx-int8 tiles from 4 rows" in caplog.text
