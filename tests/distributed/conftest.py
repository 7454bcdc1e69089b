"""Fixtures for the tensor-parallel tests: no test may hang, and none may leave a process behind."""

from __future__ import annotations

import faulthandler
import os
import sys
from pathlib import Path

import pytest

# Helper modules (tiny_models from tests/model, tp_faults here) import by name, here and in the
# spawned workers (which inherit sys.path).
HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "model"))
sys.path.insert(0, str(HERE))

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
    """Every worker a test started is gone when it ends (multiprocessing's resource tracker aside)."""
    before = child_processes()
    yield
    left = {pid: cmd for pid, cmd in child_processes().items()
            if pid not in before and "resource_tracker" not in cmd}
    assert not left, f"processes left behind: {left}"


def child_processes() -> dict[int, str]:
    """This process's live children: pid -> command line."""
    children = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            state = stat.rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and state != "Z":
            children[int(entry.name)] = cmdline
    return children
