"""``dtype = "auto"`` where no model is timed (tensor-parallel ranks, CUDA): bf16 where the CPU computes it
natively and a matmul runs faster than fp32, fp32 elsewhere; names always win."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from hetero_core.cache import cache_file
from hetero_core.default_plugins.torch_executor import TorchExecutorOptions
from hetero_core.model.cpu import bf16_speed as cpu_bf16_speed
from hetero_core.model.cpu import compute_dtype, cpu_info
from hetero_core.model.cpu.kernels import load_cpu_kernels
from hetero_core.model.cpu.linear import PackedLinear, can_pack
from tests.model.damaged_files import invalid_cache_warnings

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
    """Point the flag reader at a fake /proc/cpuinfo holding ``text`` (and report its flags, not the
    suite's pinned ones: HETERO_CPU_FLAGS unset)."""

    def use(text: str | None) -> None:
        path = tmp_path / "cpuinfo"
        if text is not None:
            path.write_text(text)
        monkeypatch.setattr(cpu_info, "CPUINFO", path)
        monkeypatch.delenv(cpu_info.CPU_FLAGS_ENV, raising=False)
        cpu_info.hardware_cpu_flags.cache_clear()

    yield use
    cpu_info.hardware_cpu_flags.cache_clear()


def test_the_default_is_auto():
    assert TorchExecutorOptions().dtype == "auto"


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("native", [True, False])
def test_an_explicit_dtype_always_wins(name, native, monkeypatch):
    monkeypatch.setattr(compute_dtype, "cpu_has_native_bf16", lambda: native)
    assert compute_dtype.resolve_dtype(name, CPU) == getattr(torch, name)


@pytest.mark.parametrize(
    "native, speedup, expected",
    [
        (True, 4.3, torch.bfloat16),  # AMD Zen 5: bf16 matmuls ~4x fp32
        (True, 0.53, torch.float32),  # Intel Emerald Rapids without AMX: bf16 at about half the fp32 rate
        (True, 1.1, torch.float32),  # no clear gain: keep fp32's precision
        (False, 4.3, torch.float32),
    ],
)
def test_auto_on_the_cpu_needs_native_bf16_that_is_faster(native, speedup, expected, monkeypatch, tmp_path):
    monkeypatch.setattr(compute_dtype, "cpu_has_native_bf16", lambda: native)
    monkeypatch.setattr(cpu_bf16_speed, "default_cache_dir", lambda: tmp_path)
    monkeypatch.setattr(cpu_bf16_speed, "measure_bf16_speedup", lambda: speedup)
    assert compute_dtype.resolve_dtype("auto", CPU) == expected


def test_the_bf16_speed_is_measured_once_per_cpu_and_cached(cpuinfo, monkeypatch, tmp_path):
    cpuinfo(CPUINFO_AVX512_BF16 + "model name\t: AMD EPYC 9B45\n")
    measured = []

    def measure():
        measured.append(1)
        return 4.0

    monkeypatch.setattr(cpu_bf16_speed, "measure_bf16_speedup", measure)
    assert cpu_bf16_speed.bf16_speedup(tmp_path) == 4.0
    assert cpu_bf16_speed.bf16_speedup(tmp_path) == 4.0  # from the file
    assert len(measured) == 1
    cached = json.loads(cache_file.read_checked(tmp_path / cpu_bf16_speed.CACHE_FILE))
    [(key, value)] = cached.items()
    assert "AMD EPYC 9B45" in key and torch.__version__ in key and value == 4.0
    cpuinfo(CPUINFO_AVX512_BF16 + "model name\t: Intel(R) Xeon(R) Processor\n")  # another CPU: measured again
    assert cpu_bf16_speed.bf16_speedup(tmp_path) == 4.0
    assert (
        len(measured) == 2
        and len(json.loads(cache_file.read_checked(tmp_path / cpu_bf16_speed.CACHE_FILE))) == 2
    )


def measured_speedups(tmp_path) -> dict:
    return json.loads(cache_file.read_checked(tmp_path / cpu_bf16_speed.CACHE_FILE))


@pytest.mark.parametrize("value", ["NaN", "-2.5", "0", "Infinity", '"fast"', "true", "[4.0]"])
def test_a_speed_that_is_not_a_positive_number_is_measured_again(value, monkeypatch, tmp_path, caplog):
    """A NaN used to pin fp32 for good (NaN >= 1.2 is False, and it was never measured again)."""
    (tmp_path / cpu_bf16_speed.CACHE_FILE).write_text(f'{{"{cpu_bf16_speed._cpu_key()}": {value}}}')
    monkeypatch.setattr(cpu_bf16_speed, "measure_bf16_speedup", lambda: 4.0)
    with caplog.at_level(logging.WARNING, logger="hetero"):
        assert cpu_bf16_speed.bf16_speedup(tmp_path) == 4.0
    [warning] = invalid_cache_warnings(caplog)
    assert cpu_bf16_speed.CACHE_FILE in warning and "rebuilding" in warning
    assert measured_speedups(tmp_path) == {cpu_bf16_speed._cpu_key(): 4.0}


def test_a_checksummed_nan_is_measured_again_too(monkeypatch, tmp_path, caplog):
    key = cpu_bf16_speed._cpu_key()
    cache_file.write_checked(
        tmp_path / cpu_bf16_speed.CACHE_FILE, f'{{"{key}": NaN, "other cpu": 2.0}}'.encode()
    )
    monkeypatch.setattr(cpu_bf16_speed, "measure_bf16_speedup", lambda: 0.5)
    with caplog.at_level(logging.WARNING, logger="hetero"):
        assert cpu_bf16_speed.bf16_speedup(tmp_path) == 0.5
    [warning] = invalid_cache_warnings(caplog)
    assert "not a positive finite number" in warning
    assert measured_speedups(tmp_path) == {key: 0.5, "other cpu": 2.0}


@pytest.mark.parametrize(
    "content",
    [b"not json", b"[1, 2]", b'{"key": "not a number"}', b"", pytest.param(b"\x00" * 64, id="zeros")],
)
def test_a_damaged_speed_cache_is_measured_again_with_one_warning(content, monkeypatch, tmp_path, caplog):
    (tmp_path / cpu_bf16_speed.CACHE_FILE).write_bytes(content)
    monkeypatch.setattr(cpu_bf16_speed, "measure_bf16_speedup", lambda: 0.6)
    with caplog.at_level(logging.WARNING, logger="hetero"):
        assert cpu_bf16_speed.bf16_speedup(tmp_path) == 0.6
        assert cpu_bf16_speed.bf16_speedup(tmp_path) == 0.6  # from the rewritten file: no second warning
    assert len(invalid_cache_warnings(caplog)) == 1
    assert 0.6 in measured_speedups(tmp_path).values()


def test_a_measurement_that_is_not_a_positive_number_is_not_kept(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_bf16_speed, "measure_bf16_speedup", lambda: float("nan"))
    assert not cpu_bf16_speed.bf16_is_faster(tmp_path)
    assert not (tmp_path / cpu_bf16_speed.CACHE_FILE).exists()


def test_an_unwritable_speed_cache_still_answers(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(cpu_bf16_speed, "measure_bf16_speedup", lambda: 2.0)
    assert cpu_bf16_speed.bf16_speedup(blocker / "cache") == 2.0  # its parent is a file: no cache, no error


def test_the_measurement_times_both_dtypes():
    speedup = cpu_bf16_speed.measure_bf16_speedup()
    assert 0 < speedup < float("inf")


def test_flags_come_from_proc_cpuinfo(cpuinfo):
    cpuinfo(CPUINFO_AVX512_BF16)
    flags = cpu_info.cpu_flags()
    assert {"avx2", "avx512f", "avx512_bf16"} <= flags
    assert compute_dtype.native_bf16_flags(flags) == ["avx512_bf16"]
    assert compute_dtype.native_bf16_flags(frozenset({"amx_bf16", "avx512_bf16"})) == [
        "avx512_bf16",
        "amx_bf16",
    ]


@pytest.mark.parametrize("reported", ["avx2 avx512f amx_tile amx_bf16", "avx2,avx512f, amx_tile,amx_bf16"])
def test_reported_flags_replace_this_cpus_for_decisions_never_for_what_runs(reported, cpuinfo, monkeypatch):
    cpuinfo(CPUINFO_AVX2)
    monkeypatch.setenv(cpu_info.CPU_FLAGS_ENV, reported)
    assert cpu_info.cpu_flags() == {"avx2", "avx512f", "amx_tile", "amx_bf16"}
    assert compute_dtype.native_bf16_flags(cpu_info.cpu_flags()) == ["amx_bf16"]
    assert cpu_info.hardware_cpu_flags() == {"fpu", "sse2", "avx2", "fma"}  # the kernels' build key
    monkeypatch.setenv(cpu_info.CPU_FLAGS_ENV, "")
    assert cpu_info.cpu_flags() == frozenset()  # set but empty: a CPU with no flags reported


@pytest.mark.parametrize("text", [CPUINFO_AVX2, "processor\t: 0\n", None])  # no bf16, no flags line, no file
def test_without_native_bf16_flags_auto_is_float32(text, cpuinfo):
    cpuinfo(text)
    assert not compute_dtype.cpu_has_native_bf16()
    assert compute_dtype.resolve_dtype("auto", CPU) == torch.float32


def test_an_auto_executor_whose_probe_finds_bf16_faster_runs_bf16_with_packed_linears(
    tiny_model_dirs, make_executor, monkeypatch, tmp_path
):
    """(The executor's ``auto`` on the CPU times the model itself: tests/model/test_dtype_choice.py.)"""
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))  # its made-up times never reach the user's cache
    from hetero_core.model.cpu import dtype_probe
    from hetero_core.model.cpu.dtype_choice import StepTimes

    monkeypatch.setattr(compute_dtype, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(
        dtype_probe,
        "time_steps",
        lambda runner, ceiling_s=None: StepTimes(*[1.0 if runner.dtype == torch.float32 else 0.5] * 3),
    )
    model_dir, _ = tiny_model_dirs["llama"]
    executor = make_executor(model_dir, options=TorchExecutorOptions(dtype="auto"))
    assert executor.dtype == torch.bfloat16
    assert executor.kv_caches[0].key.dtype == torch.bfloat16
    packed = [m for m in executor.model.modules() if isinstance(m, PackedLinear)]
    # Packed by the compiled kernels' bf16 linear where they build, else by oneDNN where it runs bf16
    # (an AVX2-only CPU has the first and not the second).
    assert bool(packed) == can_pack(CPU, torch.bfloat16, load_cpu_kernels())
