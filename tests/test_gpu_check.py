"""The one GPU check's CPU-runnable parts: ``hetero bench gpu-offline --dry-run`` and its per-step
timing, and ``scripts/gpu_check.sh`` (its mistakes; ``--dry-run`` whole, marked slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def test_gpu_offline_dry_run_reports_host_and_device_time_per_step(tmp_path, capsys):
    from hetero_core.cli.main import main

    code = main(["bench", "gpu-offline", "--executor", "torch", "--dry-run", "--model-dir", str(tmp_path / "model"),
                 "--json", str(tmp_path / "out.json")])
    assert code == 0
    out = capsys.readouterr().out
    assert "dry run: CPU, tiny model" in out and "host ms/step" in out and "device ms/step" in out
    results = json.loads((tmp_path / "out.json").read_text())
    assert results["num_requests"] == 4 and results["output_tokens"] > 0
    assert results["num_steps"] > 0 and results["device_ms_per_step"] == 0  # no CUDA: host clocks only
    assert results["host_ms_per_step"] == pytest.approx(results["wall_ms_per_step"])


@pytest.mark.parametrize("argv, message", [
    (["--executor", "triton"], "--dry-run runs its wiring on the CPU"),
    (["--executor", "cuda", "--dry-run"], "the cuda executor's start-up needs CUDA"),
])
def test_gpu_offline_without_a_gpu_says_what_runs_instead(capsys, argv, message):
    import torch

    from hetero_core.cli.main import main

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["bench", "gpu-offline", *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_script_names_its_options_on_a_mistake():
    result = subprocess.run(["bash", str(SCRIPT), "--dyr-run"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "unknown option '--dyr-run'; options: --dry-run, --budget SECONDS, --wheels DIR" in result.stderr


@pytest.mark.slow
def test_the_script_runs_dry_on_the_cpu(tmp_path):
    """Every phase on the CPU: the packages, a few tests, a tiny run per executor, results in $OUT."""
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    result = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--wheels", str(tmp_path / "no-wheels"),
                             "--budget", "600"], capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, result.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "tests passed" in summary, summary
    for name in ("triton", "torch"):
        assert json.loads((tmp_path / "out" / f"{name}.json").read_text())["output_tokens_per_s"] > 0
