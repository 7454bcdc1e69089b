"""``--memory-limit``: sizes, a cgroup per engine (v2 or v1 files, made in a stand-in tree), and, where
this process may make real cgroups, an engine over its limit OOM-killed and counted."""

from __future__ import annotations

import sys

import pytest

from hetero_bench import memory_limit
from hetero_bench.engine_process import measure
from hetero_bench.memory_limit import LimitUnavailable, open_limit, parse_size

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroups are Linux's")


@pytest.mark.parametrize(
    ("text", "size"),
    [("21G", 21 << 30), ("512M", 512 << 20), ("1.5g", 3 << 29), ("4096", 4096), ("2GiB", 2 << 30)],
)
def test_sizes_are_binary_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "21X", "-1G", "0", "G"])
def test_a_bad_size_says_what_a_size_looks_like(text):
    with pytest.raises(ValueError, match="expected a size such as 21G"):
        parse_size(text)


def test_v2_a_child_of_the_root_with_memory_max_and_its_oom_kills(tmp_path, monkeypatch):
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory pids\n")
    monkeypatch.setattr(memory_limit, "CGROUP_ROOT", tmp_path)
    limit = open_limit("engine", 21 << 30)
    assert limit.path == tmp_path / "engine" and (limit.path / "memory.max").read_text() == str(21 << 30)
    assert limit.oom_kills() == 0 and limit.peak_mb() is None  # the files a kernel writes are not there
    (limit.path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (limit.path / "memory.peak").write_text(str(3 << 20))
    assert limit.oom_kills() == 1 and limit.peak_mb() == 3.0
    assert limit.wrap(["python", "-c", "1"])[-3:] == ["python", "-c", "1"]
    for name in ("memory.max", "memory.events", "memory.peak"):
        (limit.path / name).unlink()
    limit.close()
    assert not limit.path.exists()


def test_v1_a_child_of_this_process_s_memory_cgroup(tmp_path, monkeypatch):
    own = tmp_path / "memory" / "sessions" / "abc"
    own.mkdir(parents=True)
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712")
    proc = tmp_path / "cgroup"
    proc.write_text("5:cpu:/\n4:memory:/sessions/abc\n0::/\n")
    monkeypatch.setattr(memory_limit, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(memory_limit, "PROC_CGROUP", proc)
    limit = open_limit("engine", 1 << 30)
    assert limit.path == own / "engine" and (limit.path / "memory.limit_in_bytes").read_text() == str(1 << 30)
    (limit.path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert limit.oom_kills() == 2


def test_no_memory_controller_is_one_line_saying_so(tmp_path, monkeypatch):
    monkeypatch.setattr(memory_limit, "CGROUP_ROOT", tmp_path)
    with pytest.raises(LimitUnavailable, match="no cgroup memory controller"):
        open_limit("engine", 1 << 30)
    (tmp_path / "cgroup.subtree_control").write_text("cpu\n")
    with pytest.raises(LimitUnavailable, match="without the memory controller"):
        open_limit("engine", 1 << 30)


def test_an_engine_over_its_limit_is_oom_killed_and_counted():
    try:
        limit = open_limit(f"hetero-bench-test-{id(object())}", 64 << 20)
    except LimitUnavailable as exc:
        pytest.skip(f"no cgroup here: {exc}")
    grow = "import sys, time; blocks = [bytearray(16 << 20) for _ in range(32)]; print('{}'); time.sleep(60)"
    try:
        result = measure([sys.executable, "-c", grow], {}, [1, 2], 4, timeout_s=60, limit=limit)
    finally:
        limit.close()
    assert result.oom_killed and result.first_token_s is None
    assert result.error.startswith("OOM-killed")
    assert not limit.path.exists()
