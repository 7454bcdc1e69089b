"""Decode throughput on the CPU with and without one other busy process.

Question: how much of its idle throughput does the engine keep when another process keeps one core
busy (``python -c 'while True: pass'``)? It builds the engine once (the embedded model on the torch
executor by default, so the executor's own thread sizing and OpenMP settings are what is measured),
then alternates rounds: idle, then with a busy child process. Each round generates ``--max-tokens``
tokens greedily for one prompt (batch 1, EOS ignored). Reported per round: tokens/s idle and busy and
their ratio; then the medians. Environment variables (e.g. OMP_WAIT_POLICY=ACTIVE) apply: torch is
imported by the engine, after the command starts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from hetero_bench.options import add_engine_arguments, engine_settings, positive_int
from hetero_bench.report import Column, Panel, Report, Table

SUMMARY = "decode tokens/s with and without one busy neighbour process (batch 1)"
NEEDS = "torch and the model (--executor mock runs without them)"
PROMPT = "Once upon a time"
BUSY_LOOP = "while True: pass"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=positive_int, default=5, help="idle/busy pairs (default: 5)")
    parser.add_argument("--max-tokens", type=positive_int, default=32, help="tokens per round (default: 32)")
    parser.add_argument(
        "--num-threads",
        type=positive_int,
        metavar="N",
        help="the torch executor's num_threads (default: the executor's own choice)",
    )
    add_engine_arguments(parser)


def tokens_per_second(engine, max_tokens: int) -> float:
    from hetero_core import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    [output] = engine.generate([PROMPT], params)
    return len(output.output_token_ids) / (time.perf_counter() - start)


def run(args: argparse.Namespace) -> Report:
    from hetero_core import LLM

    options = {"num_threads": args.num_threads} if args.num_threads else None
    llm = LLM.from_settings(engine_settings(args, options, max_num_blocks=64))
    idle, busy = [], []
    try:
        tokens_per_second(llm.engine, 4)  # warm-up: oneDNN primitives, first-touch pages
        for number in range(1, args.rounds + 1):
            idle.append(tokens_per_second(llm.engine, args.max_tokens))
            child = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
            try:
                time.sleep(0.5)  # let the OS place it
                busy.append(tokens_per_second(llm.engine, args.max_tokens))
            finally:
                child.kill()
                child.wait()
            print(
                f"round {number}/{args.rounds}: idle {idle[-1]:.1f}, busy {busy[-1]:.1f} tokens/s",
                file=sys.stderr,
            )
            time.sleep(0.5)
    finally:
        llm.shutdown()
    rows = [
        {"round": n, "idle_tokens_per_s": i, "busy_tokens_per_s": b, "ratio": b / i}
        for n, (i, b) in enumerate(zip(idle, busy), 1)
    ]
    median_idle, median_busy = statistics.median(idle), statistics.median(busy)
    ratios = [r["ratio"] for r in rows]
    summary = [
        f"median: idle {median_idle:.1f}, busy {median_busy:.1f} tokens/s; ratio of medians "
        f"{median_busy / median_idle:.2f} (median of ratios {statistics.median(ratios):.2f}); "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, load average at end {os.getloadavg()[0]:.2f}"
    ]
    columns = [
        Column("round", "round"),
        Column("idle_tokens_per_s", "idle tok/s", ".1f"),
        Column("busy_tokens_per_s", "busy tok/s", ".1f"),
        Column("ratio", "ratio", ".2f"),
    ]
    panels = [
        Panel(
            "decode throughput, batch 1",
            "tokens/s",
            [str(r["round"]) for r in rows],
            {"idle": idle, "one busy process": busy},
            xlabel="round",
        )
    ]
    settings = {
        **{k: v for k, v in vars(args).items() if k not in ("json", "plot")},
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "prompt": PROMPT,
    }
    return Report(
        "busy-cpu",
        settings,
        Table(columns, rows),
        [f"{args.rounds} rounds of {args.max_tokens} greedy tokens, idle then beside `{BUSY_LOOP}`"],
        summary,
        {
            "median_idle_tokens_per_s": median_idle,
            "median_busy_tokens_per_s": median_busy,
            "ratio_of_medians": median_busy / median_idle,
            "load_average_at_end": os.getloadavg(),
        },
        panels,
        title="Decode throughput beside a busy process",
    )
