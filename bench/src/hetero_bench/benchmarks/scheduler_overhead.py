"""Scheduler + allocator time per running sequence per step (goal: <= 5 µs), on the mock executor.

Workload: N requests (prompts of 32-256 tokens, 128 output tokens, greedy) queued at once with room
for all of them to run together; every ``schedule()`` call is timed (policy snapshot and decision,
prefix-cache bookkeeping, block growth, batch building) and divided by the sequences it scheduled;
the median over the steps is reported, over all steps and over decode-only steps (where the
per-sequence cost matters most), with the prefix cache off and on.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from hetero_bench.options import positive_int
from hetero_bench.report import Column, Panel, Report, Table

SUMMARY = "scheduler time per running sequence per step (mock executor)"
NEEDS = "hetero-plugins-mock"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--num-requests",
        type=positive_int,
        nargs="+",
        default=[64, 256],
        metavar="N",
        help="running sequences to measure (default: 64 256)",
    )
    parser.add_argument("--policy", default="fcfs", help="scheduler policy by name (default: fcfs)")


def measure(num_requests: int, policy: str, caching: bool) -> tuple[float, float]:
    from hetero_core import LLM, SamplingParams, load_settings

    settings = load_settings(
        executor="mock",
        scheduler_policy=policy,
        enable_prefix_caching=caching,
        max_num_blocks=num_requests * 30,
        max_batch_size=num_requests,
        max_num_seqs=num_requests,
        max_total_tokens=8192,
    )
    llm = LLM.from_settings(settings)
    engine = llm.engine
    rng = random.Random(0)
    params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    for _ in range(num_requests):
        engine.add_request([rng.randint(32, 126) for _ in range(rng.randint(32, 256))], params)
    all_steps, decode_steps = [], []
    schedule = engine.scheduler.schedule

    def timed():
        start = time.perf_counter()
        step = schedule()
        elapsed = time.perf_counter() - start
        if step.seqs:
            per_seq = elapsed / len(step.seqs)
            all_steps.append(per_seq)
            if not any(step.batch.is_prefill):
                decode_steps.append(per_seq)
        return step

    engine.scheduler.schedule = timed
    try:
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        llm.shutdown()
    return statistics.median(all_steps) * 1e6, statistics.median(decode_steps) * 1e6 if decode_steps else None


def run(args: argparse.Namespace) -> Report:
    rows = []
    for n in args.num_requests:
        for caching in (False, True):
            every, decode = measure(n, args.policy, caching)
            rows.append(
                {
                    "num_requests": n,
                    "prefix_caching": "on" if caching else "off",
                    "all_steps_us_per_seq": every,
                    "decode_steps_us_per_seq": decode,
                }
            )
    columns = [
        Column("num_requests", "requests"),
        Column("prefix_caching", "prefix cache"),
        Column("all_steps_us_per_seq", "all steps µs/seq", ".2f"),
        Column("decode_steps_us_per_seq", "decode steps µs/seq", ".2f"),
    ]
    labels = [str(n) for n in args.num_requests]
    panels = [
        Panel(
            "scheduler time per sequence per step (decode steps)",
            "µs per running sequence",
            labels,
            {
                f"prefix cache {mode}": [
                    r["decode_steps_us_per_seq"] for r in rows if r["prefix_caching"] == mode
                ]
                for mode in ("off", "on")
            },
            xlabel="running sequences",
        )
    ]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    return Report(
        "scheduler-overhead",
        settings,
        Table(columns, rows),
        [f"policy {args.policy}, mock executor"],
        ["goal: <= 5 µs per running sequence per step"],
        {},
        panels,
        title="Scheduler overhead (mock executor)",
    )
