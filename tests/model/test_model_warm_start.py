"""Warm-start and thread helpers of the model package: lazily zeroed memory, CPU thread sizing,
OpenMP wait policy, conversion progress, the embedding built without random init."""

import io
import os
from pathlib import Path

import pytest
import torch

from hetero_core.model.cpu import threads as cpu_threads
from hetero_core.model.cpu.zeroed_memory import lazy_zeros
from hetero_core.model.progress import StepProgress


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lazy_zeros_reads_as_zeros_and_takes_writes(dtype):
    tensor = lazy_zeros((4, 16, 3, 8), dtype)
    assert tensor.shape == (4, 16, 3, 8) and tensor.dtype == dtype and tensor.is_contiguous()
    assert not tensor.any()
    tensor.view(-1, 3, 8).index_copy_(0, torch.tensor([5, 63]), torch.ones(2, 3, 8, dtype=dtype))
    assert tensor.sum().item() == 48 and tensor[0, 5].all() and tensor[3, 15].all()


def test_lazy_zeros_outlives_its_creator():
    tensors = [lazy_zeros((256, 64), torch.float32) for _ in range(3)]
    import gc

    gc.collect()
    tensors[1].fill_(2.0)
    assert tensors[0].sum().item() == 0 and tensors[1].sum().item() == 2.0 * 256 * 64


def test_empty_shape_is_fine():
    assert lazy_zeros((0, 4), torch.float32).shape == (0, 4)


def test_threads_default_to_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(cpu_threads.os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert cpu_threads.available_cpus() == 3
    assert cpu_threads.intra_op_threads(None) == 3
    assert cpu_threads.intra_op_threads(1) == 1


@pytest.fixture
def no_wait_policy(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)


def _proc_stat(tmp_path, busy: int, idle: int) -> Path:
    path = tmp_path / f"stat-{busy}-{idle}"
    path.write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\n")
    return path


def test_the_wait_policy_is_chosen_only_before_torch_and_never_over_the_users_choice(
    no_wait_policy, monkeypatch
):
    # torch is loaded in this process: too late for libgomp to see it, so nothing is set.
    assert cpu_threads.choose_openmp_wait() is None
    assert "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ
    monkeypatch.delitem(cpu_threads.sys.modules, "torch")
    for name, value in (("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "10")):
        monkeypatch.setenv(name, value)
        assert cpu_threads.choose_openmp_wait() is None and os.environ[name] == value
        monkeypatch.delenv(name)


@pytest.mark.parametrize("busy_ticks, expected", [(0, "spin"), (1000, "passive")])
def test_idle_cpus_get_a_short_spin_and_busy_ones_sleep(
    no_wait_policy, monkeypatch, tmp_path, busy_ticks, expected
):
    """Two samples of /proc/stat, 1000 ticks apart: no busy ticks (idle CPUs) or all of them busy."""
    monkeypatch.delitem(cpu_threads.sys.modules, "torch")
    later = _proc_stat(tmp_path, busy_ticks, 1000 - busy_ticks)
    monkeypatch.setattr(cpu_threads.time, "sleep", lambda seconds: setattr(cpu_threads, "PROC_STAT", later))
    monkeypatch.setattr(cpu_threads, "PROC_STAT", _proc_stat(tmp_path, 0, 0))
    assert cpu_threads.choose_openmp_wait() == expected
    if expected == "spin":
        assert os.environ["GOMP_SPINCOUNT"] == cpu_threads.SHORT_SPIN and "OMP_WAIT_POLICY" not in os.environ
    else:
        assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and "GOMP_SPINCOUNT" not in os.environ


def test_an_unreadable_proc_stat_counts_as_busy(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_threads, "PROC_STAT", tmp_path / "missing")
    assert cpu_threads.cpus_are_idle(sample_s=0) is False


def test_num_threads_option_is_validated():
    from pydantic import ValidationError

    from hetero_core.default_plugins.torch_options import TorchExecutorOptions

    assert TorchExecutorOptions(num_threads=1).num_threads == 1
    for bad in (0, -2, "many", 1.5):
        with pytest.raises(ValidationError):
            TorchExecutorOptions(num_threads=bad)


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_off_a_terminal_is_one_line_at_start_and_end():
    stream = io.StringIO()
    with StepProgress("converting m.gguf", total=3, stream=stream) as progress:
        for _ in range(3):
            progress.advance()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "hetero: converting m.gguf ..."
    assert lines[1].startswith("hetero: converting m.gguf: done in ") and len(lines) == 2


def test_progress_on_a_terminal_draws_a_bar():
    pytest.importorskip("tqdm")
    stream = FakeTerminal()
    with StepProgress("converting m.gguf", total=2, stream=stream) as progress:
        progress.advance()
        progress.advance()
    text = stream.getvalue()
    assert "converting m.gguf:" in text and "/2 [" in text and "\r" in text
    assert text.rstrip().splitlines()[-1].lstrip("\r ").startswith("hetero: converting m.gguf: done")


def test_progress_reports_a_failure():
    stream = io.StringIO()
    with pytest.raises(RuntimeError):
        with StepProgress("converting m.gguf", total=2, stream=stream):
            raise RuntimeError("disk full")
    assert "converting m.gguf: failed in" in stream.getvalue()


def test_loading_a_model_imports_no_dynamo(tmp_path):
    """Random init on the meta device used to import torch._dynamo: ~1.5 s of every warm start."""
    import subprocess
    import sys

    from tests.model.tiny_models import save_tiny_model

    save_tiny_model("llama", tmp_path)
    code = (
        "import sys; from hetero_core.model.loader import load_model; "
        f"load_model({str(tmp_path)!r}); print('torch._dynamo' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_threads_follow_the_cpus_other_processes_leave_free(monkeypatch):
    """Two CPUs: alone, the executor keeps both threads; when /proc/stat shows the machine busier
    than this process by about one CPU, it drops to one thread; when the other load goes, back to two.
    Measurements happen at most every interval."""
    monkeypatch.setattr(cpu_threads.os, "cpu_count", lambda: 2)
    clock, cpu_time, ticks = [0.0], [0.0], [(0, 0)]
    monkeypatch.setattr(cpu_threads, "_busy_and_total_ticks", lambda: ticks[0])
    calls = []
    threads = cpu_threads.FreeCpuThreads(
        2, calls.append, interval_s=0.25, clock=lambda: clock[0], cpu_time=lambda: cpu_time[0]
    )

    def advance(wall: float, machine_busy_cpus: float, own_cpus: float) -> int:
        busy, total = ticks[0]
        ticks[0] = (busy + round(machine_busy_cpus * wall * 100), total + round(2 * wall * 100))
        clock[0] += wall
        cpu_time[0] += own_cpus * wall
        return threads.update()

    assert advance(0.5, machine_busy_cpus=2.0, own_cpus=2.0) == 2  # alone, both CPUs ours
    assert advance(0.5, machine_busy_cpus=2.0, own_cpus=1.0) == 1  # a neighbour takes one
    assert advance(0.1, machine_busy_cpus=1.0, own_cpus=1.0) == 1  # too soon to measure again
    assert advance(0.5, machine_busy_cpus=2.0, own_cpus=1.0) == 1  # neighbour still there
    assert advance(0.5, machine_busy_cpus=1.0, own_cpus=1.0) == 2  # gone
    assert advance(30.0, machine_busy_cpus=2.0, own_cpus=0.0) == 2  # the engine was idle: no decision
    assert advance(0.5, machine_busy_cpus=2.0, own_cpus=2.0) == 2
    assert calls == [1, 2]


def test_threads_stay_put_where_proc_stat_cannot_be_read(monkeypatch):
    monkeypatch.setattr(cpu_threads, "_busy_and_total_ticks", lambda: None)
    clock = [0.0]
    calls = []
    threads = cpu_threads.FreeCpuThreads(2, calls.append, clock=lambda: clock[0], cpu_time=lambda: 0.0)
    clock[0] = 5.0
    assert threads.update() == 2 and calls == []


def test_the_executor_adapts_threads_only_when_it_chose_them(tiny_model_dirs, make_executor):
    from hetero_core.default_plugins.torch_options import TorchExecutorOptions

    model_dir, _ = tiny_model_dirs["llama"]
    assert make_executor(model_dir)._free_cpu_threads is not None
    assert make_executor(model_dir, options=TorchExecutorOptions(num_threads=1))._free_cpu_threads is None
