"""Warm start: how long until `hetero run` has its first token, with the model already converted, when it
loads the model itself and when a running `hetero serve` of the same model answers it (``reuse_server``).

Runs ``hetero run --max-tokens 1 --temperature 0 PROMPT`` in a fresh subprocess ``--runs`` times per arm
(once first, untimed: it converts the model on first use and warms the page cache; each round then asks
a new prompt, the same in both arms, so that the server's prefix cache does not help it) and reports the
median wall time from process start to exit: an upper bound on time to first token that includes
the interpreter's start, every import, loading the weights (the local arm), the prefill and the exit;
and the CPU seconds of the ``hetero run`` process (on a shared machine less noisy than wall time; the
served arm's prefill runs in the server, whose CPU is not counted). The arms alternate run by run:
``local`` (``--no-reuse-server``) and ``served`` (a ``hetero serve`` of the same engine flags, started
by this benchmark before the first run and stopped after the last; left out with ``--local-only``).
Flags after ``--`` go to ``hetero run``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import TextIO

from hetero_bench.options import add_engine_arguments, engine_flags, positive_int
from hetero_bench.report import Column, Panel, Report, Table
from hetero_core import HeteroError

SUMMARY = "process start to first token of `hetero run`: loading the model vs reusing a running serve"
NEEDS = "torch and the model (--executor mock runs without them); the served arm: hetero-core[server]"
PROMPT = "What is the capital of France?"
REUSED = "answered by hetero serve at"
LABELS = {"local": "local (loads the model)", "served": "reusing hetero serve"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=positive_int, default=7, help="timed runs per arm (default: 7)")
    parser.add_argument(
        "--local-only",
        action="store_true",
        help="time only the local arm (no hetero serve started, nothing reused)",
    )
    add_engine_arguments(parser)
    parser.add_argument("run_flags", nargs="*", metavar="-- RUN FLAGS", help="more flags for hetero run")


def hetero_command() -> list[str]:
    script = shutil.which("hetero", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "hetero_core"]


def prompt(i: int) -> str:
    """Round ``i``'s prompt: a new one each round, so the server's prefix cache holds none of it (a local
    run's cache starts empty anyway)."""
    return f"Question {i}: {PROMPT}"


def timed_run(flags: list[str], reuse: bool = False, text: str = PROMPT) -> tuple[float, float]:
    """Wall seconds from the start to the exit of one ``hetero run``, and its CPU seconds; ``reuse``:
    answered by a server (checked)."""
    arm = ["--reuse-server"] if reuse else ["--no-reuse-server"]
    command = hetero_command() + ["run", *arm, "--max-tokens", "1", "--temperature", "0", *flags, text]
    cpu = _children_cpu()
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    cpu = _children_cpu() - cpu
    last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    if done.returncode != 0:
        raise HeteroError(f"hetero run failed (exit {done.returncode}): {last}")
    if reuse and REUSED not in done.stderr:
        raise HeteroError(
            f"the served arm's hetero run loaded the model itself ({last}): its flags after -- must "
            "not change the engine (they are not given to hetero serve)"
        )
    return elapsed, cpu


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def start_serve(engine: list[str], log: TextIO) -> subprocess.Popen:
    """``hetero serve`` of ``engine`` flags on a free loopback port, recording itself (``--reuse-server``,
    whatever HETERO_REUSE_SERVER says), its output to ``log``; returns once it answers."""
    from hetero_bench.benchmarks.serving import free_port, wait_until_healthy

    port = free_port()
    command = hetero_command() + ["serve", "--port", str(port), "--log-level", "warning"]
    command += [*engine, "--reuse-server"]
    process = subprocess.Popen(command, stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    def detail() -> str:
        log.seek(0)
        return (log.read().strip().splitlines() or ["(no output)"])[-1]

    wait_until_healthy(process, f"http://127.0.0.1:{port}", "hetero serve", exit_detail=detail)
    return process


def run(args: argparse.Namespace) -> Report:
    from hetero_bench.benchmarks.serving import stop_server

    flags = engine_flags(args) + list(args.run_flags)
    arms = ["local"] if args.local_only else ["local", "served"]
    wall: dict[str, list[float]] = {arm: [] for arm in arms}
    cpu: dict[str, list[float]] = {arm: [] for arm in arms}
    timed_run(flags)  # converts on first use; warms the page cache
    server, log = None, tempfile.TemporaryFile("w+", encoding="utf-8")
    try:
        if "served" in arms:
            server = start_serve(engine_flags(args), log)
            timed_run(flags, reuse=True)  # untimed too: the first request warms the server
        for i in range(args.runs):
            for arm in arms:
                seconds, cpu_seconds = timed_run(flags, reuse=arm == "served", text=prompt(i + 1))
                wall[arm].append(seconds)
                cpu[arm].append(cpu_seconds)
            shown = ", ".join(f"{arm} {wall[arm][-1]:.2f} s" for arm in arms)
            print(f"run {i + 1}/{args.runs}: {shown}", file=sys.stderr)
    finally:
        if server is not None:
            stop_server(server)
        log.close()
    return _report(args, flags, arms, wall, cpu)


def _report(args, flags: list[str], arms: list[str], wall: dict, cpu: dict) -> Report:
    median = {arm: statistics.median(wall[arm]) for arm in arms}
    median_cpu = {arm: statistics.median(cpu[arm]) for arm in arms}
    rows = [
        {"run": i + 1, **{f"{a}_s": wall[a][i] for a in arms}, **{f"{a}_cpu_s": cpu[a][i] for a in arms}}
        for i in range(args.runs)
    ]
    summary = [
        f"warm start to first token (process start to exit, --max-tokens 1), local: median "
        f"{median['local']:.2f} s, min {min(wall['local']):.2f} s, CPU {median_cpu['local']:.2f} s"
    ]
    if "served" in arms:
        summary.append(
            f"reusing a running hetero serve: median {median['served']:.2f} s, min {min(wall['served']):.2f} "
            f"s ({median['local'] / median['served']:.1f}x faster), CPU {median_cpu['served']:.2f} s "
            "(this process; the prefill ran in the server)"
        )
    summary.append(f"load average {os.getloadavg()[0]:.2f}")
    results = {"median_s": median["local"], "min_s": min(wall["local"]), "cpu_median_s": median_cpu["local"]}
    if "served" in arms:
        results |= {
            "served_median_s": median["served"],
            "served_min_s": min(wall["served"]),
            "served_cpu_median_s": median_cpu["served"],
        }
    columns = [Column("run", "run")] + [Column(f"{a}_s", f"{LABELS[a]} s", ".2f") for a in arms]
    columns += [Column(f"{a}_cpu_s", f"{a} CPU s", ".2f") for a in arms]
    panels = [
        Panel(
            "hetero run, process start to exit",
            "seconds",
            [str(r["run"]) for r in rows],
            {LABELS[a]: wall[a] for a in arms},
            xlabel="run (" + ", ".join(f"{a} median {median[a]:.2f} s" for a in arms) + ")",
        )
    ]
    settings = {**{k: v for k, v in vars(args).items() if k not in ("json", "plot")}, "command_flags": flags}
    return Report(
        "warm-start",
        settings,
        Table(columns, rows),
        [
            "command: hetero run [--no-reuse-server | --reuse-server] --max-tokens 1 --temperature 0 "
            f"{' '.join(flags)} {prompt(1)!r} (then 'Question 2: ...', ...)"
        ],
        summary,
        results,
        panels,
        title="Warm start of `hetero run`: loading the model vs reusing hetero serve",
    )
