"""Tensor parallelism on this machine: tokens/s of TP N against TP 1, same prompts, same run.

For each size it builds an engine on the model (the embedded SmolLM2-135M by default), warms it up
with one request, then times two workloads, counting only generation (not the start of the workers
or the loading): one request alone (decode latency) and a batch of requests together (throughput).
It also checks that every size gives TP 1's greedy tokens. On a CPU the ranks share its cores
(each gets cores // size threads), so this shows the cost of the collectives, not a speed-up: TP
pays off when each rank has a device (or cores) of its own.
"""

from __future__ import annotations

import argparse
import sys
import time

from hetero_bench.options import add_engine_arguments, engine_settings, positive_int
from hetero_bench.report import Column, Panel, Report, Table

SUMMARY = "tensor parallelism: tokens/s of TP N vs TP 1 (1 request and a batch), same greedy tokens"
NEEDS = "torch and the model; an executor with tensor parallelism (torch)"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sizes",
        type=positive_int,
        nargs="+",
        default=[1, 3],
        metavar="N",
        help="tensor-parallel sizes (TP 1 always runs; default: 1 3)",
    )
    parser.add_argument(
        "--prompts", type=positive_int, default=8, help="requests in the batched workload (default: 8)"
    )
    parser.add_argument(
        "--tokens", type=positive_int, default=32, help="tokens generated per request (default: 32)"
    )
    add_engine_arguments(parser)


def measure(size: int, args) -> dict:
    from hetero_core import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    started = time.perf_counter()
    llm = LLM.from_settings(engine_settings(args, tensor_parallel_size=size))
    loaded = time.perf_counter() - started
    try:
        llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=4))  # warm-up
        start = time.perf_counter()
        single = llm.generate([PROMPT], params)
        single_s = time.perf_counter() - start
        prompts = [f"{PROMPT} Version {i}." for i in range(args.prompts)]
        start = time.perf_counter()
        batch = llm.generate(prompts, params)
        batch_s = time.perf_counter() - start
    finally:
        llm.shutdown()
    print(f"TP {size}: loaded in {loaded:.1f} s", file=sys.stderr)
    return {
        "tp": size,
        "load_s": loaded,
        "single_tokens_per_s": len(single[0].output_token_ids) / single_s,
        "batch_tokens_per_s": sum(len(o.output_token_ids) for o in batch) / batch_s,
        "_tokens": [list(o.output_token_ids) for o in single + batch],
    }


def run(args: argparse.Namespace) -> Report:
    rows = [measure(size, args) for size in sorted(set(args.sizes) | {1})]
    base = rows[0]
    for row in rows:
        row["single_vs_tp1"] = row["single_tokens_per_s"] / base["single_tokens_per_s"]
        row["batch_vs_tp1"] = row["batch_tokens_per_s"] / base["batch_tokens_per_s"]
    same = {row["tp"]: row["_tokens"] == base["_tokens"] for row in rows}
    for row in rows:
        del row["_tokens"]
        row["greedy_tokens"] = "same as TP1" if same[row["tp"]] else "DIFFER from TP1"
    columns = [
        Column("tp", "TP"),
        Column("load_s", "load s", ".1f"),
        Column("single_tokens_per_s", "1 request tok/s", ".1f"),
        Column("single_vs_tp1", "vs TP1", ".2f", "x"),
        Column("batch_tokens_per_s", f"{args.prompts} requests tok/s", ".1f"),
        Column("batch_vs_tp1", "vs TP1", ".2f", "x"),
        Column("greedy_tokens", "greedy tokens"),
    ]
    labels = [f"TP {row['tp']}" for row in rows]
    panels = [
        Panel(
            "generation throughput",
            "tokens/s",
            labels,
            {
                "1 request": [r["single_tokens_per_s"] for r in rows],
                f"{args.prompts} requests": [r["batch_tokens_per_s"] for r in rows],
            },
        )
    ]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    return Report(
        "tensor-parallel",
        settings,
        Table(columns, rows),
        [
            f"model {args.model or 'the embedded SmolLM2-135M-Instruct'}; {args.tokens} greedy tokens per "
            f"request; {args.prompts} requests in the batch"
        ],
        [],
        {"same_tokens_as_tp1": same},
        panels,
        title="Tensor parallelism: TP N vs TP 1",
    )
