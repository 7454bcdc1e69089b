"""Warm start: how long until `hetero run` has its first token, with the model already converted.

Runs ``hetero run --max-tokens 1 --temperature 0 PROMPT`` in a fresh subprocess ``--runs`` times
(once first, untimed: it converts the model on first use and warms the page cache) and reports the
median wall time from process start to exit: an upper bound on time to first token that includes
the interpreter's start, every import, loading the weights, the prefill and the exit. Flags after
``--`` go to ``hetero run``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

from hetero_bench.options import add_engine_arguments, engine_flags, positive_int
from hetero_bench.report import Column, Panel, Report, Table
from hetero_core import HeteroError

SUMMARY = "process start to first token of `hetero run`, model already converted"
NEEDS = "torch and the model (--executor mock runs without them)"
PROMPT = "What is the capital of France?"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=positive_int, default=7, help="timed runs (default: 7)")
    add_engine_arguments(parser)
    parser.add_argument("run_flags", nargs="*", metavar="-- RUN FLAGS", help="more flags for hetero run")


def hetero_command() -> list[str]:
    script = shutil.which("hetero", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "hetero_core"]


def timed_run(flags: list[str]) -> float:
    command = hetero_command() + ["run", "--max-tokens", "1", "--temperature", "0", *flags, PROMPT]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise HeteroError(f"hetero run failed (exit {done.returncode}): {last}")
    return elapsed


def run(args: argparse.Namespace) -> Report:
    flags = engine_flags(args) + list(args.run_flags)
    timed_run(flags)  # converts on first use; warms the page cache
    times = []
    for i in range(args.runs):
        times.append(timed_run(flags))
        print(f"run {i + 1}/{args.runs}: {times[-1]:.2f} s", file=sys.stderr)
    median = statistics.median(times)
    rows = [{"run": i + 1, "seconds": t} for i, t in enumerate(times)]
    summary = [
        f"warm start to first token (process start to exit, --max-tokens 1): median {median:.2f} s, "
        f"min {min(times):.2f} s; load average {os.getloadavg()[0]:.2f}"
    ]
    panels = [
        Panel(
            "hetero run, process start to exit",
            "seconds",
            [str(r["run"]) for r in rows],
            {"run": times},
            xlabel=f"run (median {median:.2f} s)",
        )
    ]
    settings = {**{k: v for k, v in vars(args).items() if k not in ("json", "plot")}, "command_flags": flags}
    return Report(
        "warm-start",
        settings,
        Table([Column("run", "run"), Column("seconds", "seconds", ".2f")], rows),
        [f"command: hetero run --max-tokens 1 --temperature 0 {' '.join(flags)} {PROMPT!r}"],
        summary,
        {"median_s": median, "min_s": min(times)},
        panels,
        title="Warm start of `hetero run`",
    )
