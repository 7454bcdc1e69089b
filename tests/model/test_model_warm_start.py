"""Warm-start and thread helpers of the model package: lazily zeroed memory, CPU thread sizing,
OpenMP wait policy, conversion progress, the embedding built without random init."""

import io
import os

import pytest
import torch

from hetero_core.model import cpu_threads
from hetero_core.model.progress import StepProgress
from hetero_core.model.zeroed_memory import lazy_zeros


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


def test_passive_wait_only_before_torch_and_never_over_the_users_choice(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    # torch is loaded in this process: too late for libgomp to see it, so nothing is set.
    assert cpu_threads.prefer_passive_openmp_wait() is False and "OMP_WAIT_POLICY" not in os.environ
    monkeypatch.delitem(cpu_threads.sys.modules, "torch")
    assert cpu_threads.prefer_passive_openmp_wait() is True and os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert cpu_threads.prefer_passive_openmp_wait() is False and os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


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

    from tiny_models import save_tiny_model

    save_tiny_model("llama", tmp_path)
    code = (
        "import sys; from hetero_core.model.loader import load_model; "
        f"load_model({str(tmp_path)!r}); print('torch._dynamo' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
