"""Warm start: how long until `hetero run` has its first token, with the model already converted, when it
loads the model itself and when a running `hetero serve` of the same model answers it (``reuse_server``).

Runs ``hetero run --max-tokens 1 --temperature 0 PROMPT`` in a fresh subprocess ``--runs`` times per arm
(once first, untimed: it converts the model on first use and warms the page cache) and reports the
median wall time from process start to exit: an upper bound on time to first token that includes
the interpreter's start, every import, loading the weights (the local arm), the prefill and the exit.
The arms alternate run by run: ``local`` (``--no-reuse-server``) and ``reusing hetero serve`` (a
``hetero serve`` of the same engine flags, started by this benchmark before the first run and stopped
after the last; left out with ``--local-only``). Flags after ``--`` go to ``hetero run``.
"""

from __future__ import annotations

import argparse
import os
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


def timed_run(flags: list[str], reuse: bool = False) -> float:
    """Seconds from the start to the exit of one ``hetero run``; ``reuse``: answered by a server (checked)."""
    arm = ["--reuse-server"] if reuse else ["--no-reuse-server"]
    command = hetero_command() + ["run", *arm, "--max-tokens", "1", "--temperature", "0", *flags, PROMPT]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise HeteroError(f"hetero run failed (exit {done.returncode}): {last}")
    if reuse and REUSED not in done.stderr:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise HeteroError(
            f"the served arm's hetero run loaded the model itself ({last}): its flags after -- must "
            "not change the engine (they are not given to hetero serve)"
        )
    return elapsed


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
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    timed_run(flags)  # converts on first use; warms the page cache
    server, log = None, tempfile.TemporaryFile("w+", encoding="utf-8")
    try:
        if "served" in arms:
            server = start_serve(engine_flags(args), log)
            timed_run(flags, reuse=True)  # untimed too: the first request warms the server
        for i in range(args.runs):
            for arm in arms:
                times[arm].append(timed_run(flags, reuse=arm == "served"))
            shown = ", ".join(f"{arm} {times[arm][-1]:.2f} s" for arm in arms)
            print(f"run {i + 1}/{args.runs}: {shown}", file=sys.stderr)
    finally:
        if server is not None:
            stop_server(server)
        log.close()
    return _report(args, flags, arms, times)


def _report(args, flags: list[str], arms: list[str], times: dict[str, list[float]]) -> Report:
    medians = {arm: statistics.median(times[arm]) for arm in arms}
    rows = [{"run": i + 1, **{f"{arm}_s": times[arm][i] for arm in arms}} for i in range(len(times["local"]))]
    summary = [
        f"warm start to first token (process start to exit, --max-tokens 1), local: median "
        f"{medians['local']:.2f} s, min {min(times['local']):.2f} s"
    ]
    if "served" in arms:
        summary.append(
            f"reusing a running hetero serve: median {medians['served']:.2f} s, min "
            f"{min(times['served']):.2f} s ({medians['local'] / medians['served']:.1f}x faster)"
        )
    summary.append(f"load average {os.getloadavg()[0]:.2f}")
    labels = {"local": "local (loads the model)", "served": "reusing hetero serve"}
    panels = [
        Panel(
            "hetero run, process start to exit",
            "seconds",
            [str(r["run"]) for r in rows],
            {labels[arm]: times[arm] for arm in arms},
            xlabel="run (" + ", ".join(f"{arm} median {medians[arm]:.2f} s" for arm in arms) + ")",
        )
    ]
    settings = {**{k: v for k, v in vars(args).items() if k not in ("json", "plot")}, "command_flags": flags}
    columns = [Column("run", "run")] + [Column(f"{arm}_s", f"{labels[arm]} s", ".2f") for arm in arms]
    results = {"median_s": medians["local"], "min_s": min(times["local"])}
    if "served" in arms:
        results |= {"served_median_s": medians["served"], "served_min_s": min(times["served"])}
    return Report(
        "warm-start",
        settings,
        Table(columns, rows),
        [
            f"command: hetero run [--no-reuse-server | --reuse-server] --max-tokens 1 --temperature 0 "
            f"{' '.join(flags)} {PROMPT!r}"
        ],
        summary,
        results,
        panels,
        title="Warm start of `hetero run`: loading the model vs reusing hetero serve",
    )
