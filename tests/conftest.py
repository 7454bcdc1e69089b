"""Shared fixtures. Each test builds its own world; only expensive, read-only assets are shared."""

from __future__ import annotations

import os

import pytest

import tests.progress_lines as progress_lines
import tests.tiers as tiers


def pytest_configure(config):
    progress_lines.register(config)


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m deselection reads the marks
def pytest_collection_modifyitems(config, items):
    """The slow tier (``-m "not slow"`` leaves it out): marked by hand, or by the rules in tests/tiers.py."""
    for item in items:
        if item.get_closest_marker("slow") is None:
            reason = tiers.slow_reason(item.nodeid, item.fixturenames)
            if reason is not None:
                item.add_marker(pytest.mark.slow(reason=reason))


@pytest.fixture(scope="session")
def smollm2_dir():
    """The embedded SmolLM2-135M-Instruct converted to an HF directory (cached across runs)."""
    pytest.importorskip("torch")
    from hetero_core.model.embedded import ensure_embedded_model

    return ensure_embedded_model()


@pytest.fixture(autouse=True)
def _clean_hetero_env(monkeypatch, tmp_path_factory):
    """No HETERO_* variable from the caller's shell leaks into a test; and no `hetero run` of a test is
    answered by a `hetero serve` another test (or the user) left running on the shared cache dir, nor
    records a server for them: HETERO_REUSE_SERVER=false, unless a test of that asks otherwise."""
    import os

    for key in list(os.environ):
        if key.startswith("HETERO_") and key != "HETERO_CACHE_DIR":
            monkeypatch.delenv(key)
    monkeypatch.setenv("HETERO_REUSE_SERVER", "false")


# The CPUs the suite must pass on, as the flags ``cpu_flags()`` reports (hetero_core.model.cpu.cpu_info):
# an AMX Xeon, a Zen 4 (AVX-512 BF16, no AMX), a Xeon without either, an AVX2-only EPYC.
_AVX2 = "sse2 avx avx2 fma bmi2"
_AVX512 = f"{_AVX2} avx512f avx512bw avx512vl avx512dq avx512cd avx512_vnni"
CPU_FLAG_SETS = {
    "amx": f"{_AVX512} avx512_bf16 amx_tile amx_bf16",
    "avx512_bf16": f"{_AVX512} avx512_bf16",
    "avx512": _AVX512,
    "avx2": _AVX2,
}
# Reported in every test unless it asks for another (cpu_flag_set): AVX-512 without bf16 or AMX, so bf16
# runs on the AVX-512 kernels. A run under another set (AMX's gate on emulated tiles, for one):
# HETERO_CPU_FLAGS=<a set's name, or flags> .venv/bin/python -m pytest ... (docs/testing.md)
_REPORTED = os.environ.get("HETERO_CPU_FLAGS", "avx512")


@pytest.fixture(autouse=True)
def _reported_cpu_flags(_clean_hetero_env, monkeypatch):
    """Every decision that reads the CPU's flags sees ``_REPORTED``'s, never this machine's; and
    ``dtype = "auto"`` is float32 whatever they are (no native bf16), so greedy-equality tests against HF
    stay in fp32 (tests of bf16 ask for it by name; cpu_flag_set decides auto by the flags)."""
    yield from _reporting(CPU_FLAG_SETS.get(_REPORTED, _REPORTED), monkeypatch, native_bf16=False)


@pytest.fixture(params=list(CPU_FLAG_SETS))
def cpu_flag_set(request, monkeypatch):
    """Each of ``CPU_FLAG_SETS`` reported in turn (parametrize it, ``indirect=True``, for fewer); its name."""
    yield from _reporting(CPU_FLAG_SETS[request.param], monkeypatch, request.param)


def _reporting(flags: str, monkeypatch, name: str | None = None, native_bf16: bool | None = None):
    """Report ``flags`` (HETERO_CPU_FLAGS, which subprocesses inherit) and decide by them alone: native
    bf16 by the flags (not by this machine's oneDNN too; ``native_bf16`` pins it), and the AMX gate, where
    they have AMX, on the emulated tiles (csrc/amx_emulation.h), so no AMX instruction runs and the bits
    are the same on every CPU. The gate's per-process answer is forgotten before and after."""
    monkeypatch.setenv("HETERO_CPU_FLAGS", flags)
    try:
        from hetero_core.model.cpu import amx, compute_dtype, cpu_info
    except ImportError:  # no torch in this environment
        yield name
        return
    monkeypatch.setattr(
        compute_dtype,
        "cpu_has_native_bf16",
        lambda: (
            native_bf16
            if native_bf16 is not None
            else bool(compute_dtype.native_bf16_flags(cpu_info.cpu_flags()))
        ),
    )
    load = amx.load_cpu_kernels
    monkeypatch.setattr(
        amx,
        "load_cpu_kernels",
        lambda required=False, extra_flags=(), cache_dir=None: load(
            required, amx.AMX_EMULATED_CFLAGS if extra_flags == amx.AMX_CFLAGS else extra_flags, cache_dir
        ),
    )
    amx._variant.cache_clear()
    yield name
    amx._variant.cache_clear()


@pytest.fixture(autouse=True)
def _restore_hetero_logger():
    """A test that runs the CLI in-process configures logging (structlog's level filter, the 'hetero'
    logger's handlers and propagation); put both back so later tests' caplog sees engine events."""
    import logging

    import structlog

    logger = logging.getLogger("hetero")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    saved_structlog = structlog.get_config()
    yield
    logger.handlers[:], logger.level, logger.propagate = saved
    structlog.configure(**saved_structlog)


@pytest.fixture
def make_mock_engine():
    """Build an engine on the mock executor with a fresh plugin set; keyword args are settings."""
    import hetero_plugins_mock
    from hetero_core.builder import build_engine
    from hetero_core.plugin_system.discovery import load_plugins
    from hetero_core.settings import load_settings

    def make(mock_options=None, **overrides):
        executor = {"name": "mock", "mock": mock_options or {}}
        settings = load_settings(executor=executor, **overrides)
        plugins = load_plugins(entry_points=[], extra_plugins=[("mock", hetero_plugins_mock)])
        return build_engine(settings, plugins)

    return make


class RecordingExecutor:
    """Wraps an executor and keeps every batch it was given."""

    def __init__(self, inner):
        self.inner = inner
        self.capabilities = inner.capabilities
        self.batches = []

    def execute(self, batch):
        self.batches.append(batch)
        return self.inner.execute(batch)

    def shutdown(self):
        self.inner.shutdown()


@pytest.fixture
def recording():
    def wrap(engine):
        engine.executor = RecordingExecutor(engine.executor)
        return engine.executor

    return wrap
