"""Pipeline parallelism on this machine: tokens/s of TP x PP layouts against one process, same
prompts, same run.

For each layout (``TPxPP``: tensor-parallel ranks per stage x pipeline stages) it builds an engine
on the model (the embedded SmolLM2-135M by default), warms it up with one request, then times two
workloads, counting only generation (not the start of the workers or the loading): one request
alone (decode latency) and a batch of requests together (throughput). It checks that every layout
gives 1x1's greedy tokens. With stages the engine keeps two steps of disjoint requests in flight
(docs/scaling.md): stage 0 runs step t+1 while the last stage finishes step t, so ``vs 1x1`` is what
that overlap buys against the hand-offs between stages; each layout with stages also runs one step
at a time (``async_scheduling = false``), the row that shows the overlap. On a CPU the stages
share its cores: with fewer cores than processes the overlap cannot show as a speed-up.
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


def measure(tp: int, pp: int, args, in_flight: int = 2) -> dict:
    """``in_flight``: steps in the pipeline at once (1: ``async_scheduling = false``, the baseline
    that shows what the overlap buys)."""
    from hetero_core import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    started = time.perf_counter()
    fixed = dict(tensor_parallel_size=tp, pipeline_parallel_size=pp)
    if in_flight == 1:
        fixed["async_scheduling"] = False
    llm = LLM.from_settings(engine_settings(args, **fixed))
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
    name = f"{tp}x{pp}" + (", 1 step in flight" if pp > 1 and in_flight == 1 else "")
    print(f"{name}: loaded in {loaded:.1f} s", file=sys.stderr)
    return {
        "layout": name,
        "processes": tp * pp,
        "steps_in_flight": in_flight if pp > 1 else 1,
        "load_s": loaded,
        "single_tokens_per_s": len(single[0].output_token_ids) / single_s,
        "batch_tokens_per_s": sum(len(o.output_token_ids) for o in batch) / batch_s,
        "_tokens": [list(o.output_token_ids) for o in single + batch],
    }


def run(args: argparse.Namespace) -> Report:
    layouts = sorted(set(args.layouts) | {(1, 1)}, key=lambda lp: (lp[0] * lp[1], lp[1]))
    rows = []
    for tp, pp in layouts:
        if pp > 1:  # the same layout one step at a time: what the overlap of two steps buys
            rows.append(measure(tp, pp, args, in_flight=1))
        rows.append(measure(tp, pp, args))
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
        Column("steps_in_flight", "steps in flight"),
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
            "steps in flight 2: stage 0 on step t+1 while the last stage finishes step t (requests "
            "split between the two); 1: async_scheduling = false, one step at a time, the same layout; "
            "the stages share this machine's cores",
        ],
        [],
        {"same_tokens_as_1x1": same},
        panels,
        title="Pipeline parallelism: TPxPP vs 1x1",
    )
