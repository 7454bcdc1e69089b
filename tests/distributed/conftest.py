"""Fixtures for the tensor-parallel tests: no test may hang, and none may leave a process behind."""

from __future__ import annotations

import faulthandler
from pathlib import Path

import pytest

from tests.process_tree import live_children

# Helper modules (tiny_models from tests/model, tp_faults here) import by name, here and in the
# worker processes (which take rank 0's sys.path).
HERE = Path(__file__).parent

HANG_LIMIT_S = 300  # far beyond any test here: only a hang gets there


@pytest.fixture(autouse=True)
def no_hang():
    """A test still running after HANG_LIMIT_S dumps every thread's stack and ends the run (a
    collective blocked in C++ would never see a Python-level timeout)."""
    faulthandler.dump_traceback_later(HANG_LIMIT_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Every process a test started (workers, scripts) is gone when it ends."""
    before = live_children()
    yield
    left = {pid: cmd for pid, cmd in live_children().items() if pid not in before}
    assert not left, f"processes left behind: {left}"
