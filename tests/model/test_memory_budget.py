"""The memory this process may take: MemAvailable and the cgroup limits, on fake /proc and /sys roots."""

from __future__ import annotations

import subprocess
import sys

from hetero_core.model.cpu.memory_budget import format_bytes, mem_available, memory_budget

GIB = 1 << 30


def fake_proc(tmp_path, mem_available_kb: int | None, cgroup: str):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    lines = ["MemTotal:       24000000 kB", "MemFree:         1000000 kB"]
    if mem_available_kb is not None:
        lines.append(f"MemAvailable:   {mem_available_kb} kB")
    (proc / "meminfo").write_text("\n".join(lines) + "\n")
    (proc / "self" / "cgroup").write_text(cgroup)
    return proc


def cgroup_files(folder, **files) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in files.items():
        (folder / name.replace("_", ".", 1)).write_text(f"{value}\n")


def test_mem_available_alone_without_cgroup_limits(tmp_path):
    proc = fake_proc(tmp_path, 8 * 1024 * 1024, "0::/user.slice\n")
    cgroup_files(tmp_path / "sys" / "user.slice", memory_max="max", memory_current=5 * GIB)
    budget = memory_budget(proc, tmp_path / "sys")
    assert budget.available_bytes == 8 * GIB
    assert "MemAvailable" in budget.source


def test_a_v2_limit_below_mem_available_wins_limit_minus_usage(tmp_path):
    proc = fake_proc(tmp_path, 20 * 1024 * 1024, "0::/docker/abc\n")
    cgroup_files(tmp_path / "sys" / "docker" / "abc", memory_max=4 * GIB, memory_current=1 * GIB)
    budget = memory_budget(proc, tmp_path / "sys")
    assert budget.available_bytes == 3 * GIB
    assert "docker/abc/memory.max" in budget.source


def test_a_parent_groups_limit_binds_its_children(tmp_path):
    proc = fake_proc(tmp_path, 20 * 1024 * 1024, "0::/slice/child\n")
    cgroup_files(tmp_path / "sys" / "slice", memory_max=2 * GIB, memory_current=GIB + GIB // 2)
    cgroup_files(tmp_path / "sys" / "slice" / "child", memory_max="max", memory_current=GIB)
    assert memory_budget(proc, tmp_path / "sys").available_bytes == GIB // 2


def test_v1_memory_controller_limit_and_its_unlimited_value(tmp_path):
    proc = fake_proc(tmp_path, 20 * 1024 * 1024, "4:memory:/job\n3:cpuset:/\n0::/\n")
    cgroup_files(
        tmp_path / "sys" / "memory" / "job", memory_limit_in_bytes=6 * GIB, memory_usage_in_bytes=GIB
    )
    cgroup_files(
        tmp_path / "sys" / "memory", memory_limit_in_bytes=9223372036854771712, memory_usage_in_bytes=GIB
    )
    budget = memory_budget(proc, tmp_path / "sys")
    assert budget.available_bytes == 5 * GIB
    assert "memory.limit_in_bytes" in budget.source


def test_usage_over_the_limit_is_zero_available_not_negative(tmp_path):
    proc = fake_proc(tmp_path, 20 * 1024 * 1024, "0::/tight\n")
    cgroup_files(tmp_path / "sys" / "tight", memory_max=GIB, memory_current=2 * GIB)
    assert memory_budget(proc, tmp_path / "sys").available_bytes == 0


def test_nothing_readable_is_none_and_damaged_files_are_no_limit(tmp_path):
    assert memory_budget(tmp_path / "no-proc", tmp_path / "no-sys") is None
    proc = fake_proc(tmp_path, None, "garbage line\n0::/g\n")
    (proc / "meminfo").write_text("MemAvailable: lots\n")
    cgroup_files(tmp_path / "sys" / "g", memory_max="not a number", memory_current=1)
    assert mem_available(proc) is None
    assert memory_budget(proc, tmp_path / "sys") is None


def test_describe_and_format_bytes():
    assert format_bytes(3 * GIB // 2) == "1.50 GiB"
    assert format_bytes(300 << 20) == "300 MiB"


def test_the_module_imports_no_torch():
    code = (
        "import sys, hetero_core.model.cpu.memory_budget as m; m.memory_budget(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
