"""Pipeline parallelism on this machine: tokens/s of TP x PP layouts against one process, same
prompts, same run.

For each layout (``TPxPP``: tensor-parallel ranks per stage x pipeline stages) it builds an engine
on the model (the embedded SmolLM2-135M by default), warms it up with one request, then times two
workloads, counting only generation (not the start of the workers or the loading): one request
alone (decode latency) and a batch of requests together (throughput). It checks that every layout
gives 1x1's greedy tokens. Hetero runs one step in flight today (the stages of a step run one after
another, docs/scaling.md): no stage overlaps another, so ``vs 1x1`` shows the cost of the hand-offs
(about 1.0x at best, never the up-to-PPx of overlapped micro-batches), and PP pays only when the
model's layers do not fit one device; on a shared CPU the stages also share its cores.
"""

from __future__ import annotations

import argparse
import sys
import time

from hetero_bench.options import add_engine_arguments, engine_settings, positive_int
from hetero_bench.report import Column, Panel, Report, Table

SUMMARY = "pipeline parallelism: tokens/s of TPxPP layouts vs 1x1 (1 request and a batch), same greedy tokens"
NEEDS = "torch and the model; an executor with pipeline parallelism (torch)"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def layout(text: str) -> tuple[int, int]:
    """``TPxPP`` (``1x2``: two stages of one rank each)."""
    try:
        tp, pp = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TPxPP such as 1x2, got {text!r}") from None
    if tp < 1 or pp < 1:
        raise argparse.ArgumentTypeError(f"expected sizes of at least 1, got {text!r}")
    return tp, pp


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--layouts",
        type=layout,
        nargs="+",
        default=[(1, 2)],
        metavar="TPxPP",
        help="tensor-parallel ranks x pipeline stages (1x1 always runs; default: 1x2)",
    )
    parser.add_argument(
        "--prompts", type=positive_int, default=8, help="requests in the batched workload (default: 8)"
    )
    parser.add_argument(
        "--tokens", type=positive_int, default=32, help="tokens generated per request (default: 32)"
    )
    add_engine_arguments(parser)


def measure(tp: int, pp: int, args) -> dict:
    from hetero_core import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    started = time.perf_counter()
    llm = LLM.from_settings(engine_settings(args, tensor_parallel_size=tp, pipeline_parallel_size=pp))
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
    print(f"{tp}x{pp}: loaded in {loaded:.1f} s", file=sys.stderr)
    return {
        "layout": f"{tp}x{pp}",
        "processes": tp * pp,
        "load_s": loaded,
        "single_tokens_per_s": len(single[0].output_token_ids) / single_s,
        "batch_tokens_per_s": sum(len(o.output_token_ids) for o in batch) / batch_s,
        "_tokens": [list(o.output_token_ids) for o in single + batch],
    }


def run(args: argparse.Namespace) -> Report:
    layouts = sorted(set(args.layouts) | {(1, 1)}, key=lambda lp: (lp[0] * lp[1], lp[1]))
    rows = [measure(tp, pp, args) for tp, pp in layouts]
    base = rows[0]
    for row in rows:
        row["single_vs_1x1"] = row["single_tokens_per_s"] / base["single_tokens_per_s"]
        row["batch_vs_1x1"] = row["batch_tokens_per_s"] / base["batch_tokens_per_s"]
    same = {row["layout"]: row["_tokens"] == base["_tokens"] for row in rows}
    for row in rows:
        del row["_tokens"]
        row["greedy_tokens"] = "same as 1x1" if same[row["layout"]] else "DIFFER from 1x1"
    columns = [
        Column("layout", "TPxPP"),
        Column("processes", "processes"),
        Column("load_s", "load s", ".1f"),
        Column("single_tokens_per_s", "1 request tok/s", ".1f"),
        Column("single_vs_1x1", "vs 1x1", ".2f", "x"),
        Column("batch_tokens_per_s", f"{args.prompts} requests tok/s", ".1f"),
        Column("batch_vs_1x1", "vs 1x1", ".2f", "x"),
        Column("greedy_tokens", "greedy tokens"),
    ]
    panels = [
        Panel(
            "generation throughput",
            "tokens/s",
            [row["layout"] for row in rows],
            {
                "1 request": [r["single_tokens_per_s"] for r in rows],
                f"{args.prompts} requests": [r["batch_tokens_per_s"] for r in rows],
            },
        )
    ]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    settings["layouts"] = [f"{tp}x{pp}" for tp, pp in layouts]
    return Report(
        "pipeline-parallel",
        settings,
        Table(columns, rows),
        [
            f"model {args.model or 'the embedded SmolLM2-135M-Instruct'}; {args.tokens} greedy tokens per "
            f"request; {args.prompts} requests in the batch",
            "one step in flight: the stages of a step run one after another (no micro-batch overlap "
            "yet), so each stage waits while the others work",
        ],
        [],
        {"same_tokens_as_1x1": same},
        panels,
        title="Pipeline parallelism: TPxPP vs 1x1",
    )
