"""Every registered architecture at a common size: decode tokens/s (batch 1 and 8) and KV bytes/token.

Question: what does each model architecture this install can run (core's Llama family and every
plugin's: ``register_model_architectures``) cost per token, at about the same parameter count? Each
architecture's ``bench_config()`` (~100-200M parameters) becomes a random-weight checkpoint in the
cache (``architecture_models``), made once. One engine per architecture, then ``--rounds`` rounds;
in each, every architecture in turn (alternated, so a busy machine slows all alike) generates
``--max-tokens`` greedy tokens for 1 prompt and for 8 prompts of ``--prompt-tokens`` tokens.
Decode tokens/s: output tokens after each request's first, over the time from the last first token
to the last finish (prefill excluded). KV bytes/token: the architecture's ``kv_layout`` in the
run's dtype, all layers. Architectures registered later (MoE, MLA) appear without edits here.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from hetero_bench.options import positive_int
from hetero_bench.report import Column, Panel, Report, Table

SUMMARY = "each registered architecture at ~150M params: decode tok/s (batch 1, 8), KV bytes/token"
NEEDS = "torch and safetensors (random weights, made once in the cache)"
BATCHES = (1, 8)
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
VOCAB_SIZE = 49152  # the embedded SmolLM2 tokenizer's: one vocabulary for every architecture


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--architectures",
        nargs="+",
        metavar="NAME",
        help="only these (default: every one with a bench config)",
    )
    parser.add_argument("--rounds", type=positive_int, default=3, help="rounds (default: 3)")
    parser.add_argument(
        "--max-tokens", type=positive_int, default=64, help="tokens per request (default: 64)"
    )
    parser.add_argument("--prompt-tokens", type=positive_int, default=32, help="prompt length (default: 32)")
    parser.add_argument(
        "--dtype",
        choices=tuple(ELEMENT_BYTES),
        default="bfloat16",
        help="weights, activations and KV cache (default: bfloat16)",
    )
    parser.add_argument("--executor", default="torch", metavar="NAME", help="executor (default: torch)")
    parser.add_argument(
        "--num-hidden-layers",
        type=positive_int,
        metavar="N",
        help="override every bench config's layer count (smaller, faster runs)",
    )
    parser.add_argument(
        "--vocab-size",
        type=positive_int,
        default=VOCAB_SIZE,
        metavar="N",
        help=f"every architecture's vocabulary (default: {VOCAB_SIZE}, the embedded SmolLM2 tokenizer's, "
        "whose files are copied in; 256 or less: the byte tokenizer)",
    )
    parser.add_argument("--config", metavar="FILE", help="settings file (TOML or JSON) for the engines")


def selected(args) -> list[tuple[str, object]]:
    from hetero_bench.architecture_models import bench_architectures
    from hetero_core import HeteroError
    from hetero_core.architectures import installed_architectures

    available = bench_architectures(installed_architectures())
    if not args.architectures:
        return available
    names = [name for name, _ in available]
    unknown = [name for name in args.architectures if name not in names]
    if unknown:
        raise HeteroError(
            f"--architectures: {', '.join(unknown)} not registered with a bench config; "
            f"available: {', '.join(names)}"
        )
    return [(name, arch) for name, arch in available if name in args.architectures]


def decode_tokens_per_second(llm, num_prompts: int, prompt_tokens: int, max_tokens: int) -> float:
    from hetero_core import SamplingParams

    prompts = [[(7 * i + 3 * p) % 200 + 20 for i in range(prompt_tokens)] for p in range(num_prompts)]
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    failed = [out.error for out in outputs if out.error]
    if failed:
        from hetero_core import HeteroError

        raise HeteroError(f"a benchmark request failed: {failed[0]}")
    metrics = [out.metrics for out in outputs]
    seconds = max(m.finished_time for m in metrics) - max(m.first_token_time for m in metrics)
    return sum(m.num_output_tokens - 1 for m in metrics) / seconds


def run(args: argparse.Namespace) -> Report:
    from hetero_bench.architecture_models import (
        architecture_checkpoint,
        bench_config,
        checkpoint_shapes,
        num_parameters,
    )
    from hetero_core import LLM, load_settings
    from hetero_core.architectures import kv_bytes_per_token

    overrides = {
        k: v
        for k, v in (("num_hidden_layers", args.num_hidden_layers), ("vocab_size", args.vocab_size))
        if v is not None
    }
    engines, facts = {}, {}
    try:
        for name, architecture in selected(args):
            raw = bench_config(name, architecture, overrides)
            config, shapes = checkpoint_shapes(name, architecture, raw)
            directory = architecture_checkpoint(
                name, architecture, raw, args.dtype, tokenizer=args.vocab_size > 256
            )
            facts[name] = {
                "parameters": num_parameters(shapes),
                "num_layers": config.num_hidden_layers,
                "kv_bytes_per_token": kv_bytes_per_token(
                    architecture.kv_layout(config), ELEMENT_BYTES[args.dtype]
                ),
            }
            settings = load_settings(
                args.config,
                model=str(directory),
                executor=args.executor,
                dtype=args.dtype,
                tokenizer="byte" if args.vocab_size <= 256 else "hf",
                max_num_blocks=8 * (-(-(args.prompt_tokens + args.max_tokens) // 16) + 1),
            )
            engines[name] = LLM.from_settings(settings)
            decode_tokens_per_second(engines[name], 1, 8, 4)  # warm-up
        samples = {(name, batch): [] for name in engines for batch in BATCHES}
        for number in range(1, args.rounds + 1):
            for name, llm in engines.items():
                for batch in BATCHES:
                    samples[name, batch].append(
                        decode_tokens_per_second(llm, batch, args.prompt_tokens, args.max_tokens)
                    )
                print(
                    f"round {number}/{args.rounds}: {name} "
                    + ", ".join(f"batch {b} {samples[name, b][-1]:.1f}" for b in BATCHES)
                    + " tok/s",
                    file=sys.stderr,
                )
    finally:
        for llm in engines.values():
            llm.shutdown()
    rows = [
        {
            "architecture": name,
            **facts[name],
            **{f"batch_{b}_tokens_per_s": statistics.median(samples[name, b]) for b in BATCHES},
            **{f"batch_{b}_rounds": samples[name, b] for b in BATCHES},
        }
        for name in engines
    ]
    columns = [
        Column("architecture", "architecture"),
        Column("parameters", "params", ","),
        Column("kv_bytes_per_token", "KV B/token", ","),
        Column("batch_1_tokens_per_s", "b1 tok/s", ".1f"),
        Column("batch_8_tokens_per_s", "b8 tok/s", ".1f"),
    ]
    names = [r["architecture"] for r in rows]
    panels = [
        Panel(
            "decode throughput",
            "tokens/s",
            names,
            {f"batch {b}": [r[f"batch_{b}_tokens_per_s"] for r in rows] for b in BATCHES},
        ),
        Panel("KV cache per token", "bytes", names, {"KV": [r["kv_bytes_per_token"] for r in rows]}),
    ]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot", "handler")}
    header = [
        f"{len(rows)} architectures, random weights in {args.dtype}; {args.rounds} rounds alternating them; "
        f"{args.max_tokens} greedy tokens after {args.prompt_tokens}-token prompts; medians of rounds"
    ]
    return Report(
        "models",
        settings,
        Table(columns, rows),
        header,
        [],
        {},
        panels,
        title="Architectures at a common size",
    )
