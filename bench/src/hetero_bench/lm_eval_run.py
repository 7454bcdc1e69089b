"""Running EleutherAI's lm-evaluation-harness (``lm_eval``, in its own environment) and reading what it
writes: the aggregate metrics (``results_*.json``) and the per-item answers (``--log_samples``:
``samples_<task>_*.jsonl``), so that two models' runs on the same tasks can be compared item by item.

lm-eval is not a dependency of Hetero: it pulls datasets, evaluate, scikit-learn and more. It runs as
a program, found by path (``--lm-eval``, ``$HETERO_BENCH_LM_EVAL``, or ``lm_eval`` on PATH), with the
task files of ``data/lm_eval`` copied into a working folder (their ``data_files`` are relative to it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from hetero_core import HeteroError

LM_EVAL_ENV = "HETERO_BENCH_LM_EVAL"
INSTALL = "python3 -m venv VENV && VENV/bin/pip install torch 'lm-eval[api,hf]'"
TASKS = ("hetero_mc", "hetero_qa")  # the task files shipped in data/lm_eval
TAIL_LINES = 15  # of lm_eval's output, shown when it fails


def find_lm_eval(given: str | None) -> str:
    """The ``lm_eval`` program: ``given``, else ``$HETERO_BENCH_LM_EVAL``, else ``lm_eval`` on PATH."""
    path = given or os.environ.get(LM_EVAL_ENV) or shutil.which("lm_eval")
    if not path:
        raise HeteroError(
            f"lm_eval not found: give --lm-eval PATH (or set {LM_EVAL_ENV}); install it in its own "
            f"environment: {INSTALL}"
        )
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise HeteroError(f"--lm-eval {path}: not an executable file (the lm_eval program of lm-eval)")
    return path


def copy_tasks(folder: Path) -> Path:
    """The shipped task files (YAML and JSONL) copied into ``folder``; returns it."""
    source = resources.files("hetero_bench") / "data" / "lm_eval"
    folder.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        if entry.name.endswith((".yaml", ".jsonl")):
            (folder / entry.name).write_bytes(entry.read_bytes())
    return folder


def lm_eval_version(lm_eval: str) -> str:
    """lm-eval's version and its torch's and transformers', read with lm_eval's own interpreter."""
    python = Path(lm_eval).with_name("python")
    code = (
        "import importlib.metadata as m\n"
        "print(', '.join(f'{n} {m.version(n)}' for n in ('lm_eval', 'torch', 'transformers')))"
    )
    if not python.exists():
        return "unknown (no python beside lm_eval)"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=_clean_env())
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def run_lm_eval(lm_eval: str, model: str, model_args: str, tasks: list[str], work: Path, out: Path, limit):
    """One ``lm_eval`` run of ``tasks`` with ``--log_samples`` into ``out``; its output goes to
    ``out/lm_eval.log``. HeteroError with the log's tail when it fails."""
    out.mkdir(parents=True, exist_ok=True)
    command = [lm_eval, "--model", model, "--model_args", model_args, "--include_path", str(work)]
    command += ["--tasks", ",".join(tasks), "--log_samples", "--output_path", str(out)]
    if model == "hf":
        command += ["--device", "cpu"]
    if limit is not None:
        command += ["--limit", str(limit)]
    log_path = out / "lm_eval.log"
    with open(log_path, "w", encoding="utf-8") as log:
        done = subprocess.run(
            command,
            cwd=work,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_clean_env(),
        )
    if done.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-TAIL_LINES:]
        raise HeteroError(
            f"lm_eval --model {model} failed (exit {done.returncode}); the end of {log_path}:\n"
            + "\n".join(tail)
        )
    return command


def _clean_env() -> dict[str, str]:
    """lm_eval's environment: offline (nothing from a hub), its own packages only (no PYTHONPATH), and
    OpenMP threads that sleep while they wait: spinning, torch's default, made the hf model's forward
    11.6 s instead of 1.1 s on 2 cores shared with busy neighbours (the same choice Hetero's torch
    executor makes for itself)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


@dataclass
class TaskRun:
    """One model's run of one task: its metrics and its per-item answers by doc id."""

    metrics: dict[str, float]  # "acc", "acc_norm", "exact_match" -> value
    loglikelihoods: dict[int, list[float]]  # multiple_choice: doc id -> each choice's loglikelihood
    generations: dict[int, str]  # generate_until: doc id -> the filtered answer


def read_run(out: Path, task: str) -> TaskRun:
    """What ``lm_eval --log_samples`` wrote into ``out`` for ``task``."""
    results = _one(out, "results_*.json")
    metrics = json.loads(results.read_text(encoding="utf-8"))["results"][task]
    values = {
        key.split(",")[0]: value
        for key, value in metrics.items()
        if "," in key and "_stderr" not in key and isinstance(value, (int, float))
    }
    loglikelihoods, generations = {}, {}
    for line in _one(out, f"samples_{task}_*.jsonl").read_text(encoding="utf-8").splitlines():
        sample = json.loads(line)
        answers = sample["filtered_resps"]
        if answers and isinstance(answers[0], list):  # [loglikelihood, is_greedy] per choice
            loglikelihoods[sample["doc_id"]] = [float(ll) for ll, _ in answers]
        else:
            generations[sample["doc_id"]] = answers[0]
    return TaskRun(values, loglikelihoods, generations)


def _one(out: Path, pattern: str) -> Path:
    found = sorted(out.rglob(pattern))
    if len(found) != 1:
        raise HeteroError(f"expected one {pattern} under {out} (lm_eval's output), found {len(found)}")
    return found[0]
