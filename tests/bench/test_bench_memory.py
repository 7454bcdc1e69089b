"""``hetero bench``'s resident-memory figures: a process's VmRSS, and a process group's summed."""

from __future__ import annotations

import os
import sys

import pytest

from hetero_bench import memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_this_process_has_a_resident_size_and_its_group_at_least_as_much():
    own = memory.process_rss_mb()
    assert own is not None and own > 1
    assert memory.group_rss_mb(os.getpgrp()) >= own


def test_what_cannot_be_read_is_none(tmp_path, monkeypatch):
    assert memory.process_rss_mb(2**30) is None
    monkeypatch.setattr(memory, "PROC", tmp_path)
    assert memory.group_rss_mb(os.getpgrp()) is None


def test_a_child_in_a_session_of_its_own_counts_with_its_parents_group():
    """A tensor-parallel engine's worker ranks start with ``start_new_session``: still measured."""
    import subprocess

    code = "import sys, time; sys.stdout.write('up\\n'); sys.stdout.flush(); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert child.stdout.readline() == b"up\n"
        assert os.getpgid(child.pid) != os.getpgrp()
        assert child.pid in memory.group_pids(os.getpgrp()) and os.getpid() in memory.group_pids(os.getpgrp())
        each = memory.group_hwm_each_mb(os.getpgrp())
        assert len(each) >= 2 and each == sorted(each, reverse=True)
    finally:
        child.kill()
        child.wait()
