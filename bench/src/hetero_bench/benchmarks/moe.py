"""Mixture of experts on this machine: decode tokens/s of a Qwen3-MoE against the dense Qwen3 of the
same active parameters, same run.

Both models have random weights (made once in the cache, ``moe_models``) and the same attention,
hidden size, layers and vocabulary. The MoE has ``--experts`` experts of ``--expert-size``, each
token going to ``--top-k`` of them; the dense model's MLP is ``top_k * expert_size`` wide, so a token
multiplies the same number of weights in both (the router adds ``experts * hidden``). Rounds
alternate the two engines (A B A B ...), each timing ``--tokens`` greedy tokens for one request and
for ``--batch`` requests together (short prompts: decode steps dominate). The table gives the
medians and the per-round ratio MoE / dense. At batch 1 a step reads ``top_k`` experts per layer;
at batch 8 the tokens pick up to ``top_k * 8`` different experts, so it reads more weight than the
dense model does: the ratio falls with the batch, as on any machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from hetero_bench.options import add_engine_arguments, engine_settings, positive_int
from hetero_bench.report import Column, Panel, Report, Table

SUMMARY = "mixture of experts: decode tok/s of a Qwen3-MoE vs the dense Qwen3 of the same active parameters"
NEEDS = "torch (random weights, made once in the cache)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    shape = parser.add_argument_group("shape")
    shape.add_argument("--hidden", type=positive_int, default=1024, help="hidden size (default: 1024)")
    shape.add_argument("--layers", type=positive_int, default=8, help="decoder layers (default: 8)")
    shape.add_argument("--experts", type=positive_int, default=8, help="experts per MoE layer (default: 8)")
    shape.add_argument("--top-k", type=positive_int, default=2, help="experts per token (default: 2)")
    shape.add_argument(
        "--expert-size",
        type=positive_int,
        default=1024,
        help="one expert's intermediate size; the dense MLP is top_k times it (default: 1024)",
    )
    run = parser.add_argument_group("run")
    run.add_argument("--rounds", type=positive_int, default=3, help="alternating rounds (default: 3)")
    run.add_argument(
        "--tokens", type=positive_int, default=48, help="tokens generated per request (default: 48)"
    )
    run.add_argument(
        "--batch", type=positive_int, default=8, help="requests in the batched workload (default: 8)"
    )
    add_engine_arguments(parser)


def measure(llm, args) -> dict[str, float]:
    from hetero_core import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    out = {}
    for label, count in (("batch_1", 1), (f"batch_{args.batch}", args.batch)):
        prompts = [[5 + i, 17, 33, 2, 48, 71, 9, 64] for i in range(count)]
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        out[label] = sum(len(o.output_token_ids) for o in outputs) / seconds
    return out


def run(args: argparse.Namespace) -> Report:
    from hetero_bench.moe_models import moe_pair
    from hetero_core import LLM, SamplingParams

    dtype = args.dtype if args.dtype in ("float32", "bfloat16") else "bfloat16"
    dirs = moe_pair(
        hidden=args.hidden,
        layers=args.layers,
        experts=args.experts,
        top_k=args.top_k,
        expert_size=args.expert_size,
        dtype=dtype,
    )
    args.model = None  # the pair's directories, never --model
    llms = {}
    try:
        for name, directory in dirs.items():
            settings = engine_settings(
                args,
                model=str(directory),
                tokenizer="byte",
                max_model_len=512,
                max_batch_size=max(8, args.batch),
                dtype=args.dtype or dtype,
            )
            llms[name] = LLM.from_settings(settings)
            llms[name].generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
        rounds = []
        for index in range(args.rounds):
            rounds.append({name: measure(llm, args) for name, llm in llms.items()})
            print(
                f"round {index + 1}: " + ", ".join(f"{n} {v}" for n, v in rounds[-1].items()), file=sys.stderr
            )
    finally:
        for llm in llms.values():
            llm.shutdown()
    return _report(args, dtype, rounds)


def _report(args, dtype: str, rounds: list[dict]) -> Report:
    labels = ["batch_1", f"batch_{args.batch}"]
    rows = []
    for label in labels:
        moe = [r["moe"][label] for r in rounds]
        dense = [r["dense"][label] for r in rounds]
        ratios = [m / d for m, d in zip(moe, dense, strict=True)]
        rows.append(
            {
                "workload": label.replace("_", " "),
                "moe_tokens_per_s": statistics.median(moe),
                "dense_tokens_per_s": statistics.median(dense),
                "ratio": statistics.median(ratios),
                "ratios": " ".join(f"{r:.2f}" for r in ratios),
            }
        )
    columns = [
        Column("workload", "workload"),
        Column("moe_tokens_per_s", "MoE tok/s", ".1f"),
        Column("dense_tokens_per_s", "dense tok/s", ".1f"),
        Column("ratio", "MoE/dense", ".2f", "x"),
        Column("ratios", "per round"),
    ]
    shape = (
        f"hidden {args.hidden}, {args.layers} layers; "
        f"MoE {args.experts} experts x {args.expert_size} top-{args.top_k}"
        f" vs dense MLP {args.top_k * args.expert_size}; {dtype}; {args.tokens} greedy tokens per request"
    )
    panels = [
        Panel(
            "decode throughput",
            "tokens/s",
            [r["workload"] for r in rows],
            {"MoE": [r["moe_tokens_per_s"] for r in rows], "dense": [r["dense_tokens_per_s"] for r in rows]},
        )
    ]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    return Report(
        "moe",
        settings,
        Table(columns, rows),
        [shape],
        [],
        {"rounds": rounds},
        panels,
        title="Mixture of experts vs dense, same active parameters",
    )
