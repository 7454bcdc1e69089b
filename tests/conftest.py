"""Shared fixtures. Each test builds its own world; only expensive, read-only assets are shared."""

from __future__ import annotations

import progress_lines
import pytest
import tiers


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
    """No HETERO_* variable from the caller's shell leaks into a test."""
    import os

    for key in list(os.environ):
        if key.startswith("HETERO_") and key != "HETERO_CACHE_DIR":
            monkeypatch.delenv(key)


@pytest.fixture(autouse=True)
def _auto_dtype_is_float32(monkeypatch):
    """``dtype = "auto"`` resolves to float32 in tests on every CPU, so greedy-equality tests against
    HF stay in fp32 whether or not this machine has native bf16 (tests of bf16 ask for it by name;
    tests/model/test_compute_dtype.py covers the resolution itself)."""
    try:
        from hetero_core.model.cpu import compute_dtype
    except ImportError:  # no torch in this environment
        return
    monkeypatch.setattr(compute_dtype, "cpu_has_native_bf16", lambda: False)


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
    from hetero_core.builder import build_engine
    from hetero_core.plugin_system.discovery import load_plugins
    from hetero_core.settings import load_settings

    import hetero_plugins_mock

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
