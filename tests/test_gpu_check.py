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

    code = main(
        [
            "bench",
            "gpu-offline",
            "--executor",
            "torch",
            "--dry-run",
            "--model-dir",
            str(tmp_path / "model"),
            "--json",
            str(tmp_path / "out.json"),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "dry run: CPU, tiny model" in out and "host ms/step" in out and "device ms/step" in out
    results = json.loads((tmp_path / "out.json").read_text())
    assert results["num_requests"] == 4 and results["output_tokens"] > 0
    assert results["num_steps"] > 0 and results["device_ms_per_step"] == 0  # no CUDA: host clocks only
    assert results["host_ms_per_step"] == pytest.approx(results["wall_ms_per_step"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--executor", "triton"], "--dry-run runs its wiring on the CPU"),
        (["--executor", "cuda", "--dry-run"], "the cuda executor's start-up needs CUDA"),
    ],
)
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
    result = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--wheels", str(tmp_path / "no-wheels"), "--budget", "600"],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "tests passed" in summary, summary
    for name in ("triton", "torch"):
        assert json.loads((tmp_path / "out" / f"{name}.json").read_text())["output_tokens_per_s"] > 0


def _split_wheel(root: Path) -> str:
    """A tiny wheel split like stage_gpu_wheels.sh splits a large one: part aa in .whl, ab in .whl-2."""
    import zipfile

    name = "fakepkg-1.0-py3-none-any.whl"
    wheel = root / name
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("fakepkg/__init__.py", "VALUE = 1\n" + "# padding\n" * 200)
        info = "fakepkg-1.0.dist-info"
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: fakepkg\nVersion: 1.0\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr("fakepkg-1.0.dist-info/RECORD", "")
    data = wheel.read_bytes()
    (root / ".whl").mkdir()
    (root / ".whl-2").mkdir()
    (root / ".whl" / f"{name}.part-aa").write_bytes(data[: len(data) // 2])
    (root / ".whl-2" / f"{name}.part-ab").write_bytes(data[len(data) // 2 :])
    wheel.unlink()
    return name


def _run_script(tmp_path, *args):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    return subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--wheels", str(tmp_path / ".whl"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_the_script_stops_in_one_line_when_a_split_wheel_misses_its_second_carry(tmp_path):
    name = _split_wheel(tmp_path)
    for part in (tmp_path / ".whl-2").iterdir():
        part.unlink()
    result = _run_script(tmp_path)
    assert result.returncode == 1
    [line] = result.stdout.splitlines()
    assert f"{name} is incomplete (1 parts found): carry {tmp_path}/.whl-2 too" in line


def test_the_script_joins_a_split_wheel_from_both_carries_and_installs_it(tmp_path):
    _split_wheel(tmp_path)
    result = _run_script(tmp_path, "--budget", "1")  # phase 1 only: no time is left for the rest
    assert result.returncode == 0, result.stdout + result.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "installed 1 wheels" in summary and "--dry-run does not need it" in summary
    installed = tmp_path / "hetero-gpu-check-site" / "fakepkg" / "__init__.py"
    assert installed.read_text().startswith("VALUE = 1")


def test_gpu_offline_records_flash_attn4_alone(monkeypatch):
    """flash-attn-4 alone leaves ``flash_attn`` a bare namespace package (no ``__version__``)."""
    import argparse
    import importlib.metadata
    import types

    from hetero_bench.benchmarks.gpu_offline import versions

    real = importlib.metadata.version
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "4.0.0b36" if name == "flash-attn-4" else real(name)
    )
    found = versions(argparse.Namespace(executor="cuda", flash_attn_double=None))
    assert found["flash_attn"] is None and found["attention_kernels"] == "flash-attn-4 4.0.0b36"
