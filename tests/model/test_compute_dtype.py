"""``dtype = "auto"``: bf16 where the CPU computes it natively, fp32 elsewhere; names always win."""

from __future__ import annotations

import pytest
import torch

from hetero_core.default_plugins.torch_executor import TorchExecutorOptions
from hetero_core.model import compute_dtype
from hetero_core.model.cpu_linear import PackedLinear, can_pack

CPU = torch.device("cpu")
CPUINFO_AVX512_BF16 = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni
processor\t: 1
flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni
"""
CPUINFO_AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n"


@pytest.fixture
def cpuinfo(tmp_path, monkeypatch):
    """Point the flag reader at a fake /proc/cpuinfo holding ``text``."""

    def use(text: str | None) -> None:
        path = tmp_path / "cpuinfo"
        if text is not None:
            path.write_text(text)
        monkeypatch.setattr(compute_dtype, "CPUINFO", path)
        compute_dtype.cpu_flags.cache_clear()

    yield use
    compute_dtype.cpu_flags.cache_clear()


def test_the_default_is_auto():
    assert TorchExecutorOptions().dtype == "auto"


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("native", [True, False])
def test_an_explicit_dtype_always_wins(name, native, monkeypatch):
    monkeypatch.setattr(compute_dtype, "cpu_has_native_bf16", lambda: native)
    assert compute_dtype.resolve_dtype(name, CPU) == getattr(torch, name)


@pytest.mark.parametrize("native, expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_on_the_cpu_follows_native_bf16(native, expected, monkeypatch):
    monkeypatch.setattr(compute_dtype, "cpu_has_native_bf16", lambda: native)
    assert compute_dtype.resolve_dtype("auto", CPU) == expected


def test_flags_come_from_proc_cpuinfo(cpuinfo):
    cpuinfo(CPUINFO_AVX512_BF16)
    flags = compute_dtype.cpu_flags()
    assert {"avx2", "avx512f", "avx512_bf16"} <= flags
    assert compute_dtype.native_bf16_flags(flags) == ["avx512_bf16"]
    assert compute_dtype.native_bf16_flags(frozenset({"amx_bf16", "avx512_bf16"})) == ["avx512_bf16", "amx_bf16"]


@pytest.mark.parametrize("text", [CPUINFO_AVX2, "processor\t: 0\n", None])  # no bf16, no flags line, no file
def test_without_native_bf16_flags_auto_is_float32(text, cpuinfo):
    cpuinfo(text)
    assert not compute_dtype.cpu_has_native_bf16()
    assert compute_dtype.resolve_dtype("auto", CPU) == torch.float32


def test_an_auto_executor_on_a_native_bf16_cpu_runs_bf16_with_packed_linears(
    tiny_model_dirs, make_executor, monkeypatch
):
    monkeypatch.setattr(compute_dtype, "cpu_has_native_bf16", lambda: True)
    model_dir, _ = tiny_model_dirs["llama"]
    executor = make_executor(model_dir, options=TorchExecutorOptions(dtype="auto"))
    assert executor.dtype == torch.bfloat16
    assert executor.kv_caches[0].key.dtype == torch.bfloat16
    packed = [m for m in executor.model.modules() if isinstance(m, PackedLinear)]
    assert bool(packed) == can_pack(CPU, torch.bfloat16)
