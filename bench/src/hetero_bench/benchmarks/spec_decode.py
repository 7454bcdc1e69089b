"""Speculative decoding: batch-1 and batch-8 decode latency (ms per output token, p50) and tok/s with
and without it, each proposer against no speculation in the same run.

Workloads (``spec_workloads.py``): ``lookup``, the model repeats or lightly edits a paragraph its prompt
contains (prompt lookup should pay), and ``random``, random-token prompts (it should not: the issue asks
for at least 0.95x there). Arms: ``off`` (``num_speculative_tokens = 0``) and each of ``--proposers``
(``ngram``; ``draft``, with ``--draft-model``, default the embedded SmolLM2-135M), one engine each, built
once and warmed up; in each round every arm runs the same prompts, greedy, in an order that reverses
every round (A B C, C B A, ...). Reported per workload, batch size and arm: the p50 over requests and
rounds of a request's decode time per token after its first, the median tok/s (output tokens / wall
time of the batch), the median of the per-round speedups over ``off``, the acceptance rate and mean
accepted length (the engine's counters), and whether the greedy outputs equal ``off``'s.
"""

from __future__ import annotations

import argparse
import statistics
import time

from hetero_bench.options import add_engine_arguments, engine_settings, positive_int
from hetero_bench.report import Column, Report, Table
from hetero_bench.spec_stats import speculation_counters
from hetero_bench.spec_workloads import WORKLOADS, workload_prompts
from hetero_core import HeteroError

SUMMARY = "speculative decoding (ngram, draft model) vs none: batch-1/batch-8 ms per token and tok/s"
NEEDS = "torch and the model (the draft proposer needs a model of the target's tokenizer)"
PROPOSERS = ("ngram", "draft")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--proposers",
        default="ngram,draft",
        metavar="A,B",
        help="proposers to compare with "
        f"no speculation, comma-separated (default: ngram,draft; known: {', '.join(PROPOSERS)})",
    )
    parser.add_argument(
        "-k",
        "--num-speculative-tokens",
        type=positive_int,
        default=4,
        metavar="K",
        help="tokens proposed per sequence per step (default: 4)",
    )
    parser.add_argument(
        "--draft-model",
        default=None,
        help="the draft proposer's model (default: the embedded "
        "SmolLM2-135M-Instruct; random:SHAPE as for --model)",
    )
    parser.add_argument(
        "--prompt-lookup-min", type=positive_int, help="the ngram proposer's prompt_lookup_min"
    )
    parser.add_argument(
        "--prompt-lookup-max", type=positive_int, help="the ngram proposer's prompt_lookup_max"
    )
    parser.add_argument(
        "--workloads",
        default="lookup,random",
        metavar="A,B",
        help=f"workloads, comma-separated (default: lookup,random; known: {', '.join(WORKLOADS)})",
    )
    parser.add_argument(
        "--batch-sizes", default="1,8", metavar="N,M", help="requests run at once (default: 1,8)"
    )
    parser.add_argument(
        "--output-tokens", type=positive_int, default=64, help="max tokens per request (default: 64)"
    )
    parser.add_argument(
        "--prompt-tokens", type=positive_int, default=128, help="random prompts' length (default: 128)"
    )
    parser.add_argument("--rounds", type=positive_int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    add_engine_arguments(parser)


def run(args: argparse.Namespace) -> Report:
    from hetero_core import LLM, SamplingParams

    proposers = _names(args.proposers, PROPOSERS, "--proposers")
    workloads = _names(args.workloads, WORKLOADS, "--workloads")
    batch_sizes = _batch_sizes(args.batch_sizes)
    arms = ["off", *proposers]
    llms = {arm: LLM.from_settings(engine_settings(args, **arm_settings(arm, args))) for arm in arms}
    params = SamplingParams(temperature=0, max_tokens=args.output_tokens)
    rows = []
    try:
        tokenizer = llms["off"].engine.tokenizer
        for llm in llms.values():  # warm-up: first-call costs out of the rounds
            llm.generate(
                [[100, 200, 300, 400]] * 2, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False
            )
        for workload in workloads:
            prompts = workload_prompts(workload, tokenizer, max(batch_sizes), args.prompt_tokens, args.seed)
            for batch in batch_sizes:
                runs = {arm: [] for arm in arms}
                for r in range(args.rounds):
                    for arm in arms if r % 2 == 0 else arms[::-1]:
                        runs[arm].append(measure(llms[arm], prompts[:batch], params))
                rows += summarize(workload, batch, arms, runs)
    finally:
        for llm in llms.values():
            llm.shutdown()
    return build_report(args, rows, arms)


def arm_settings(arm: str, args: argparse.Namespace) -> dict:
    """The engine settings of one arm (prefix caching off: every round computes the same work)."""
    fixed = {
        "enable_prefix_caching": False,
        "num_speculative_tokens": 0 if arm == "off" else args.num_speculative_tokens,
    }
    if arm == "ngram":
        options = {
            k: v
            for k, v in (
                ("prompt_lookup_min", args.prompt_lookup_min),
                ("prompt_lookup_max", args.prompt_lookup_max),
            )
            if v is not None
        }
        fixed["speculative_proposer"] = {"name": "ngram", "ngram": options}
    elif arm == "draft":
        from hetero_bench.options import model_path

        options = {} if args.draft_model is None else {"model": model_path(args.draft_model)}
        fixed["speculative_proposer"] = {"name": "draft", "draft": options}
    return fixed


def measure(llm, prompts: list[list[int]], params) -> dict:
    """One batch, greedy: wall time, output tokens, each request's decode seconds per token, the
    speculation counters' change, the outputs."""
    before = speculation_counters(llm)
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    wall = time.perf_counter() - start
    after = speculation_counters(llm)
    per_token = [
        1 / m.decode_tokens_per_second for m in (o.metrics for o in outputs) if m.decode_tokens_per_second
    ]
    return {
        "wall": wall,
        "tokens": sum(len(o.output_token_ids) for o in outputs),
        "per_token": per_token,
        "counters": [b - a for a, b in zip(before, after)],
        "outputs": [o.output_token_ids for o in outputs],
    }


def summarize(workload: str, batch: int, arms: list[str], runs: dict) -> list[dict]:
    base = runs["off"]
    rows = []
    for arm in arms:
        tok_s = [m["tokens"] / m["wall"] for m in runs[arm]]
        ratios = [t / (b["tokens"] / b["wall"]) for t, b in zip(tok_s, base)]
        drafts, proposed, accepted = (sum(m["counters"][i] for m in runs[arm]) for i in range(3))
        rows.append(
            {
                "workload": workload,
                "batch": batch,
                "arm": arm,
                "ms_per_token_p50": 1000
                * statistics.median([t for m in runs[arm] for t in m["per_token"]] or [0.0]),
                "tok_s": statistics.median(tok_s),
                "speedup": statistics.median(ratios),
                "round_speedups": ratios,
                "acceptance_rate": accepted / proposed if proposed else None,
                "mean_accepted_length": 1 + accepted / drafts if drafts else None,
                "proposed_tokens": proposed,
                "accepted_tokens": accepted,
                "outputs_equal_off": all(m["outputs"] == b["outputs"] for m, b in zip(runs[arm], base)),
            }
        )
    return rows


def build_report(args: argparse.Namespace, rows: list[dict], arms: list[str]) -> Report:
    columns = [
        Column("workload", "workload"),
        Column("batch", "batch"),
        Column("arm", "proposer"),
        Column("ms_per_token_p50", "ms/token p50", ".1f"),
        Column("tok_s", "tok/s", ".1f"),
        Column("speedup", "speedup", ".2f", "x"),
        Column("acceptance_rate", "accepted", ".1%"),
        Column("mean_accepted_length", "tokens/step", ".2f"),
        Column("outputs_equal_off", "greedy == off"),
    ]
    summary = [
        f"{r['workload']} batch {r['batch']} {r['arm']}: speedup per round "
        f"{', '.join(f'{x:.2f}' for x in r['round_speedups'])}"
        for r in rows
        if r["arm"] != "off"
    ]
    draft = args.draft_model or "the embedded SmolLM2-135M-Instruct"
    header = [
        f"workload: {args.rounds} rounds per arm (order reversed each round), greedy, up to "
        f"{args.output_tokens} output tokens, k = {args.num_speculative_tokens}; "
        f"target {args.model or 'the embedded SmolLM2-135M-Instruct'}"
        + (f", draft {draft}" if "draft" in arms else "")
    ]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    return Report(
        "spec-decode",
        settings,
        Table(columns, rows),
        header,
        summary,
        title="Speculative decoding: tok/s with and without",
    )


def _names(text: str, known: tuple[str, ...], flag: str) -> list[str]:
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise HeteroError(
            f"{flag} {text!r}: unknown {', '.join(unknown) or 'nothing given'}; known: {', '.join(known)}"
        )
    return names


def _batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise HeteroError(f"--batch-sizes {text!r}: expected positive integers, comma-separated, e.g. 1,8")
    return sizes
