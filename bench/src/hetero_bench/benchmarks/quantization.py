"""int8 quantization against bf16 on the same model, same run: the linears' weight memory, decode
tokens/s at batch 1 and 8 (the modes alternating within each round), greedy agreement with bf16 over a
fixed set of 20 prompts (match rate, token agreement, first-divergence position; and teacher-forced
top-1 agreement: each mode scores bf16's greedy text, the share of positions where its argmax is bf16's
token, which one early divergence cannot cascade) and perplexity on a shipped text (``quality.py``).
Modes: ``bf16`` (the reference: dtype bfloat16, no quantization), ``int8`` (weight-only), ``w8a8``
(per-token int8 activations too), and ``fp32`` (no quantization, dtype float32: how far bf16 itself
is from fp32, the floor of what agreement with bf16 can say). On a ``random:`` model only memory and
speed are measured: agreement and perplexity of random weights mean nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

from hetero_bench.options import add_engine_arguments, engine_settings, positive_int
from hetero_bench.report import Column, Report, Table

SUMMARY = "int8 weight-only and W8A8 vs bf16: weight memory, decode tok/s, greedy agreement, perplexity"
NEEDS = "torch and the model (the torch executor on the CPU)"
MODES = {
    "bf16": (None, "bfloat16"),
    "int8": ("int8", "bfloat16"),
    "w8a8": ("w8a8", "bfloat16"),
    "fp32": (None, "float32"),
}  # mode -> (quantization, dtype); fp32: bf16's own distance from fp32
BATCHES = (1, 8)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--modes",
        default="bf16,int8,w8a8",
        help="comma-separated, bf16 first (the reference): " + ", ".join(MODES),
    )
    parser.add_argument("--rounds", type=positive_int, default=3, help="alternating speed rounds")
    parser.add_argument(
        "--decode-tokens", type=positive_int, default=32, help="output tokens per timed request"
    )
    parser.add_argument(
        "--agreement-tokens",
        type=positive_int,
        default=64,
        help="greedy tokens per prompt compared with bf16's (EOS ignored)",
    )
    parser.add_argument("--window", type=positive_int, default=256, help="tokens per perplexity window")
    add_engine_arguments(parser)


def run(args: argparse.Namespace) -> Report:
    from hetero_bench.quality import agreement, perplexity, quality_prompts, quality_text, text_windows
    from hetero_bench.random_models import is_random_spec
    from hetero_core import LLM, HeteroError, SamplingParams

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes or modes[0] != "bf16":
        raise HeteroError(
            f"--modes: {args.modes!r}; choose from {', '.join(MODES)}, bf16 first (the reference)"
        )
    quality = not is_random_spec(args.model)
    prompts = quality_prompts()
    llms = {
        m: LLM.from_settings(
            engine_settings(args, dtype=MODES[m][1], quantization=MODES[m][0], enable_prefix_caching=False)
        )
        for m in modes
    }
    try:
        weight_bytes = {
            m: getattr(llm.engine.executor, "linear_weight_bytes", None) for m, llm in llms.items()
        }
        timed = SamplingParams(temperature=0, max_tokens=args.decode_tokens, ignore_eos=True)
        for llm in llms.values():  # warm-up: kernels built, pages touched
            llm.generate(prompts[:8], timed, use_tqdm=False)
        speeds = {(m, b): [] for m in modes for b in BATCHES}
        for r in range(args.rounds):
            for mode in modes if r % 2 == 0 else modes[::-1]:
                for batch in BATCHES:
                    start = time.perf_counter()
                    llms[mode].generate(prompts[:batch], timed, use_tqdm=False)
                    speeds[mode, batch].append(batch * args.decode_tokens / (time.perf_counter() - start))
        results = {}
        if quality:
            greedy = SamplingParams(temperature=0, max_tokens=args.agreement_tokens, ignore_eos=True)
            generated = {m: llm.generate(prompts, greedy, use_tqdm=False) for m, llm in llms.items()}
            outputs = {m: [o.outputs[0].token_ids for o in outs] for m, outs in generated.items()}
            # teacher-forced: each mode scores bf16's own text; its argmax equal to bf16's token (rank 1)
            forced = [
                {"prompt_token_ids": list(o.prompt_token_ids) + list(o.outputs[0].token_ids)}
                for o in generated["bf16"]
            ]
            starts = [len(o.prompt_token_ids) for o in generated["bf16"]]
            ids = llms["bf16"].engine.tokenizer.encode(quality_text())
            windows = [{"prompt_token_ids": w} for w in text_windows(ids, args.window)]
            scoring = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
            for mode, llm in llms.items():
                logprobs = [
                    entry[token].logprob
                    for out in llm.generate(windows, scoring, use_tqdm=False)
                    for entry, token in zip(out.prompt_logprobs[1:], out.prompt_token_ids[1:])
                ]
                ranks = [
                    entry[token].rank
                    for out, start in zip(llm.generate(forced, scoring, use_tqdm=False), starts)
                    for entry, token in zip(out.prompt_logprobs[start:], out.prompt_token_ids[start:])
                ]
                results[mode] = {
                    **agreement(outputs["bf16"], outputs[mode]),
                    "perplexity": perplexity(logprobs),
                    "scored_tokens": len(logprobs),
                    "top1_forced": sum(r == 1 for r in ranks) / len(ranks),
                }
    finally:
        for llm in llms.values():
            llm.shutdown()
    rows, ratios = [], {}
    for mode in modes:
        row = {"mode": mode, "weight_mib": None if weight_bytes[mode] is None else weight_bytes[mode] / 2**20}
        if weight_bytes[mode] and weight_bytes["bf16"]:
            row["weight_vs_bf16"] = weight_bytes[mode] / weight_bytes["bf16"] - 1
        for batch in BATCHES:
            row[f"tok_s_{batch}"] = statistics.median(speeds[mode, batch])
            per_round = [a / b for a, b in zip(speeds[mode, batch], speeds["bf16", batch])]
            ratios[f"{mode}_batch{batch}"] = per_round
            row[f"ratio_{batch}"] = statistics.median(per_round)
        row.update({k: v for k, v in results.get(mode, {}).items() if k != "first_divergences"})
        rows.append(row)
    columns = [
        Column("mode", "mode"),
        Column("weight_mib", "linear weights MiB", ".1f"),
        Column("weight_vs_bf16", "vs bf16", "+.1%"),
        Column("tok_s_1", "tok/s b1", ".1f"),
        Column("ratio_1", "/bf16", ".2f", "x"),
        Column("tok_s_8", "tok/s b8", ".1f"),
        Column("ratio_8", "/bf16", ".2f", "x"),
    ]
    if quality:
        columns += [
            Column("match_rate", "greedy match", ".1%"),
            Column("token_agreement", "tokens agree", ".1%"),
            Column("first_divergence_mean", "1st div mean", ".1f"),
            Column("first_divergence_median", "1st div median", ".1f"),
            Column("top1_forced", "top-1 forced", ".1%"),
            Column("perplexity", "perplexity", ".3f"),
        ]
    header = [
        f"model: {args.model or 'embedded SmolLM2-135M-Instruct'}; {len(prompts)} prompts; speed: "
        f"{args.rounds} alternating rounds of {args.decode_tokens} output tokens at batch 1 and 8"
    ]
    if not quality:
        header.append("random weights: agreement and perplexity not measured (they mean nothing here)")
    summary = [
        f"{name} / bf16 tok/s per round: {', '.join(f'{x:.2f}' for x in values)}"
        for name, values in ratios.items()
        if not name.startswith("bf16")
    ]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    extra = {
        "speed_rounds": {f"{m}_batch{b}": v for (m, b), v in speeds.items()},
        "ratios": ratios,
        "first_divergences": {m: r["first_divergences"] for m, r in results.items()},
    }
    return Report(
        "quantization",
        settings,
        Table(columns, rows),
        header,
        summary,
        extra,
        [],
        title="int8 quantization vs bf16",
    )
