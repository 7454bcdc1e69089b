"""The AMX variant of the kernels: it compiles and links for Sapphire Rapids on any x86 machine with GCC,
and its gate (CPU flags, the kernel's grant, a self-check against torch) falls back with one warning
at whichever step fails. Nothing here runs an AMX instruction or reads this CPU's flags: the flags are
injected, and the tiles are emulated (``kernel_builds``: the kernel contract and batch invariance
suites run the ``amx-emulated`` build too)."""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import platform

import pytest
import torch

from hetero_core.default_plugins import torch_auto_dtype, torch_executor
from hetero_core.default_plugins.torch_options import TorchExecutorOptions
from hetero_core.model.cpu import amx, compute_dtype, dtype_probe, prepared_weights
from hetero_core.model.cpu import kernels as cpu_kernels_module
from hetero_core.model.cpu.dtype_choice import StepTimes
from hetero_core.model.cpu.kernels import KernelUnavailable, load_cpu_kernels
from tests.model.kernel_builds import kernels_for

AMX_FLAGS = frozenset({"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})


@pytest.fixture(autouse=True)
def fresh_gate():
    amx._variant.cache_clear()
    yield
    amx._variant.cache_clear()


@pytest.fixture
def emulated(tmp_path_factory):
    return kernels_for("amx-emulated", tmp_path_factory.getbasetemp() / "kernel_builds")


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "executor.amx_unavailable" in r.getMessage()]


@pytest.mark.parametrize("march", ["native", "sapphirerapids"])
def test_the_amx_variant_compiles_and_links(march, tmp_path, monkeypatch):
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("AMX is x86")
    flags = tuple(
        f"-march={march}" if flag == "-march=native" else flag for flag in cpu_kernels_module.CFLAGS
    )
    monkeypatch.setattr(cpu_kernels_module, "CFLAGS", flags)
    try:
        path = cpu_kernels_module._build(amx.AMX_CFLAGS, tmp_path)
    except KernelUnavailable as exc:
        pytest.skip(f"this compiler cannot build AMX code: {exc}")
    assert path.name.startswith("hetero_cpu_kernels-variant-")
    library = ctypes.CDLL(str(path))  # loaded, never called: this CPU may lack what the build assumes
    for symbol in (
        "bf16_linear",
        "bf16_linear_amx",
        "amx_request_permission",
        "bf16_linear_amx_granted",
        "decode_layers",
    ):
        assert hasattr(library, symbol), symbol


def test_a_cpu_without_amx_flags_builds_nothing_and_warns_nothing(monkeypatch, caplog):
    monkeypatch.setattr(amx, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    monkeypatch.setattr(amx, "load_cpu_kernels", lambda **kw: pytest.fail("built"))
    with caplog.at_level(logging.INFO, logger="hetero"):
        assert amx.amx_kernels(load_cpu_kernels(required=True)) is None
    assert _warnings(caplog) == []


def test_a_failed_build_falls_back_with_one_warning(monkeypatch, caplog):
    monkeypatch.setattr(amx, "cpu_flags", lambda: AMX_FLAGS)

    def fail(**kwargs):
        raise KernelUnavailable("cc: unrecognized option '-mamx-tile'")

    monkeypatch.setattr(amx, "load_cpu_kernels", fail)
    base = load_cpu_kernels(required=True)
    with caplog.at_level(logging.INFO, logger="hetero"):
        assert amx.amx_kernels(base) is None and amx.amx_kernels(base) is None
    [warning] = _warnings(caplog)
    assert "build" in warning and "-mamx-tile" in warning


def test_a_refused_grant_falls_back_with_one_warning(monkeypatch, caplog):
    """The plain build's amx_request_permission always refuses: as Linux does without AMX support."""
    monkeypatch.setattr(amx, "cpu_flags", lambda: AMX_FLAGS)
    plain = load_cpu_kernels(required=True)
    monkeypatch.setattr(amx, "load_cpu_kernels", lambda **kwargs: plain)
    with caplog.at_level(logging.INFO, logger="hetero"):
        assert amx.amx_kernels(plain) is None and amx.amx_kernels(plain) is None
    [warning] = _warnings(caplog)
    assert "arch_prctl" in warning


@dataclasses.dataclass(frozen=True)
class WrongLinear:
    """Kernels whose bf16 linear answers zeros (a broken AMX build), everything else the real ones'."""

    real: object

    def request_amx(self) -> bool:
        return True

    def pack_bf16_linear(self, weight, swiglu=False):
        return self.real.pack_bf16_linear(weight, swiglu=swiglu)

    def bf16_linear(self, x, packed, bias, out_dtype=torch.bfloat16, swiglu=False):
        return torch.zeros_like(self.real.bf16_linear(x, packed, bias, out_dtype=out_dtype, swiglu=swiglu))


def test_wrong_results_fall_back_with_one_warning(monkeypatch, caplog):
    monkeypatch.setattr(amx, "cpu_flags", lambda: AMX_FLAGS)
    monkeypatch.setattr(
        amx, "load_cpu_kernels", lambda **kwargs: WrongLinear(load_cpu_kernels(required=True))
    )
    with caplog.at_level(logging.INFO, logger="hetero"):
        assert amx.amx_kernels(load_cpu_kernels(required=True)) is None
        assert amx.amx_kernels(load_cpu_kernels(required=True)) is None
    [warning] = _warnings(caplog)
    assert "self-check" in warning and "max error" in warning


def test_the_self_check_passes_the_real_linears(emulated):
    assert amx.self_check(load_cpu_kernels(required=True)) is None
    assert amx.self_check(emulated) is None


def test_a_granted_variant_that_passes_is_used_with_the_callers_settings(emulated, monkeypatch, caplog):
    monkeypatch.setattr(amx, "cpu_flags", lambda: AMX_FLAGS)
    calls = []
    monkeypatch.setattr(amx, "load_cpu_kernels", lambda **kwargs: calls.append(kwargs) or emulated)
    base = dataclasses.replace(load_cpu_kernels(required=True), block_codes=False)
    with caplog.at_level(logging.INFO, logger="hetero"):
        variant = amx.amx_kernels(base)
        assert amx.amx_kernels(base) == variant
    assert variant.amx and not variant.block_codes and variant.library is emulated.library
    cache = base.path.parent.parent  # built beside the base library, in its cache
    assert calls == [{"required": True, "extra_flags": amx.AMX_CFLAGS, "cache_dir": cache}]
    assert _warnings(caplog) == []


def test_an_explicit_bf16_executor_runs_its_linears_on_the_amx_variant(
    emulated, tiny_model_dirs, make_executor, monkeypatch
):
    """The emulated variant stands in for a granted one: the whole model runs on one library, and its
    logits are the AVX-512 path's within bf16 rounding."""
    from hetero_core.model.cpu.linear import PackedLinear
    from tests.model.paged_batches import prompt_logits

    model_dir, _ = tiny_model_dirs["llama"]
    runs = {}
    for use_amx in (False, True):
        monkeypatch.setattr(torch_executor, "amx_kernels", lambda base: emulated if use_amx else None)
        options = TorchExecutorOptions(dtype="bfloat16", cpu_kernels="compiled", prepared_weights_cache=False)
        executor = make_executor(model_dir, options=options)
        linears = [m for m in executor.model.modules() if isinstance(m, PackedLinear)]
        assert linears and all((m.kernels.library is emulated.library) == use_amx for m in linears)
        assert (executor.backend.cpu_kernels.library is emulated.library) == use_amx
        runs[use_amx] = prompt_logits(executor).float()
    scale = runs[False].abs().max().item()
    assert (runs[True] - runs[False]).abs().max().item() <= 0.05 * scale
    options = TorchExecutorOptions(dtype="bfloat16", amx_linears=False, prepared_weights_cache=False)
    monkeypatch.setattr(torch_executor, "amx_kernels", lambda base: pytest.fail("asked for AMX"))
    make_executor(model_dir, options=options)


def test_auto_times_the_amx_variant_as_a_candidate_of_its_own(
    emulated, tiny_model_dirs, make_executor, tmp_path, monkeypatch
):
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(prepared_weights, "MIN_CHECKPOINT_BYTES", 0)  # the tiny model's prepared files too
    monkeypatch.setattr(compute_dtype, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(torch_auto_dtype, "amx_kernels", lambda base: emulated)
    timed = []

    def time_steps(runner, ceiling_s=None) -> StepTimes:
        on_amx = any(
            getattr(m, "kernels", None) is not None and m.kernels.library is emulated.library
            for m in runner.model.modules()
        )
        timed.append((runner.dtype, on_amx))
        return StepTimes(0.1, 0.02, 0.01) if on_amx else StepTimes(0.2, 0.04, 0.02)

    monkeypatch.setattr(dtype_probe, "time_steps", time_steps)
    executor = make_executor(tiny_model_dirs["llama"][0], options=TorchExecutorOptions(dtype="auto"))
    assert sorted(map(str, timed)) == [
        "(torch.bfloat16, False)",
        "(torch.bfloat16, True)",
        "(torch.float32, False)",
    ]
    assert executor.dtype == torch.bfloat16 and executor.backend.cpu_kernels.library is emulated.library
    [kept] = (tmp_path / "prepared").iterdir()  # the winner's (both bf16 candidates'), not fp32's
    assert "-bfloat16-" in kept.name
