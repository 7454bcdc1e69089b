"""OpenMP's wait policy is chosen where the CPU runtime starts, before torch loads, and nowhere else.

libgomp reads ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT`` once, when torch loads it; with
``OMP_DISPLAY_ENV=VERBOSE`` it prints what it read, so these tests see what a process really runs
with, not only what Python set.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from hetero_core.model.cpu.threads import SHORT_SPIN, SPIN_COUNT_ENV, WAIT_POLICY_ENV
from tests.cli_helpers import clean_env, hetero

pytest.importorskip("torch")


def _env(**extra) -> dict[str, str]:
    env = clean_env({"OMP_DISPLAY_ENV": "VERBOSE", **extra})
    env.pop(WAIT_POLICY_ENV, None)
    env.pop(SPIN_COUNT_ENV, None)
    return env


def _spin_count_libgomp_read(stderr: str) -> str:
    match = re.search(r"GOMP_SPINCOUNT = '(\d+)'", stderr)
    if match is None:
        pytest.skip("torch here does not load GNU OpenMP (libgomp printed no environment)")
    return match.group(1)


@pytest.mark.slow
def test_hetero_run_on_the_cpu_starts_libgomp_with_the_chosen_policy(smollm2_dir):
    result = hetero("run", "--executor", "torch", "--max-tokens", "1", "hi", env=_env(), timeout=600)
    assert result.returncode == 0, result.stderr
    # A short spin where the CPUs were idle, else PASSIVE (spin count 0); never libgomp's default.
    assert _spin_count_libgomp_read(result.stderr) in (SHORT_SPIN, "0")


def test_importing_the_model_code_for_a_gpu_executor_chooses_nothing():
    code = (
        "import os\n"
        "import hetero_core.model.loader, hetero_core.model.runner, hetero_core.model.attention\n"
        "import hetero_plugins_cuda.executor, hetero_plugins_triton.executor\n"
        f"print(os.environ.get({WAIT_POLICY_ENV!r}), os.environ.get({SPIN_COUNT_ENV!r}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["None", "None"]
    assert _spin_count_libgomp_read(result.stderr) not in (SHORT_SPIN, "0")  # libgomp's own default
