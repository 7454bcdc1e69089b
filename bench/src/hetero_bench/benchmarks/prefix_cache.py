"""Prefix caching: requests that share a long system prompt, with the prefix cache off and on.

Workload (fixed by the seed): ``--num-requests`` prompts, each the same ``--system-tokens``-token
system prompt (random token ids) followed by its own question of 16-64 random tokens;
``--output-tokens`` output tokens each, greedy, EOS ignored; all queued at once. Both modes run
back to back in one process. Reported per mode: wall time, output tokens/s, mean and p50 time to
first token, the prefix-cache hit rate; then the on/off ratios and whether both made the same tokens.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from hetero_bench.options import add_engine_arguments, engine_settings, positive_int
from hetero_bench.report import Column, Panel, Report, Table

SUMMARY = "prefix cache off vs on: requests sharing a 512-token system prompt"
NEEDS = "torch and the model (--executor mock runs without them)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-requests", type=positive_int, default=32)
    parser.add_argument("--system-tokens", type=positive_int, default=512, help="length of the shared prefix")
    parser.add_argument("--output-tokens", type=positive_int, default=32, help="tokens generated per request")
    parser.add_argument("--seed", type=int, default=0)
    add_engine_arguments(parser)


def make_prompts(num_requests: int, system_tokens: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    high = vocab_size - 1
    system = [rng.randint(100, high) for _ in range(system_tokens)]  # ids from 100: no special tokens
    return [
        system + [rng.randint(100, high) for _ in range(rng.randint(16, 64))] for _ in range(num_requests)
    ]


def run_mode(args, caching: bool, vocab: list[int]) -> dict:
    from hetero_core import LLM, SamplingParams

    llm = LLM.from_settings(engine_settings(args, enable_prefix_caching=caching, max_model_len=2048))
    engine = llm.engine
    try:
        if not vocab:
            vocab.append(engine.tokenizer.vocab_size)
        prompts = make_prompts(args.num_requests, args.system_tokens, vocab[0], args.seed)
        params = SamplingParams(temperature=0, max_tokens=args.output_tokens, ignore_eos=True)
        engine.generate([[100 + i for i in range(8)]], SamplingParams(temperature=0, max_tokens=2))  # warm-up
        before = engine.stats()
        start = time.perf_counter()
        outputs = engine.generate(prompts, params)
        elapsed = time.perf_counter() - start
        stats = engine.stats()
    finally:
        llm.shutdown()
    ttft = [o.first_token_time - o.arrival_time for o in outputs]
    queried = stats.prefix_cache_queried_tokens - before.prefix_cache_queried_tokens
    hits = stats.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens
    return {
        "mode": "on" if caching else "off",
        "seconds": elapsed,
        "output_tokens_per_s": sum(len(o.output_token_ids) for o in outputs) / elapsed,
        "ttft_mean_s": statistics.fmean(ttft),
        "ttft_p50_s": statistics.median(ttft),
        "hit_tokens": hits,
        "queried_tokens": queried,
        "hit_rate": hits / queried if queried else 0.0,
        "prompt_tokens": sum(map(len, prompts)),
        "_tokens": [o.output_token_ids for o in outputs],
    }


def run(args: argparse.Namespace) -> Report:
    vocab: list[int] = []  # the tokenizer's vocabulary size, from the first engine
    off, on = (run_mode(args, caching, vocab) for caching in (False, True))
    same = on.pop("_tokens") == off.pop("_tokens")
    rows = [off, on]
    columns = [
        Column("mode", "prefix cache"),
        Column("seconds", "time s", ".2f"),
        Column("output_tokens_per_s", "out tok/s", ".1f"),
        Column("ttft_mean_s", "TTFT mean s", ".3f"),
        Column("ttft_p50_s", "TTFT p50 s", ".3f"),
        Column("hit_rate", "hit rate", ".1%"),
    ]
    ratios = {
        "throughput_on_over_off": on["output_tokens_per_s"] / off["output_tokens_per_s"],
        "mean_ttft_off_over_on": off["ttft_mean_s"] / on["ttft_mean_s"],
    }
    summary = [
        f"ratio on/off: throughput {ratios['throughput_on_over_off']:.2f}x, "
        f"mean TTFT {ratios['mean_ttft_off_over_on']:.2f}x lower",
        f"same tokens with the cache on and off: {same}",
    ]
    header = [
        f"workload: {args.num_requests} requests, {args.system_tokens}-token shared system prompt, "
        f"{off['prompt_tokens']} prompt tokens, {args.output_tokens} output tokens each, greedy"
    ]
    panels = [
        Panel(
            "output throughput",
            "output tokens/s",
            ["cache off", "cache on"],
            {"tokens/s": [off["output_tokens_per_s"], on["output_tokens_per_s"]]},
        ),
        Panel(
            "time to first token",
            "seconds",
            ["cache off", "cache on"],
            {"mean": [off["ttft_mean_s"], on["ttft_mean_s"]], "p50": [off["ttft_p50_s"], on["ttft_p50_s"]]},
        ),
    ]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    return Report(
        "prefix-cache",
        settings,
        Table(columns, rows),
        header,
        summary,
        {"ratios": ratios, "same_tokens": same},
        panels,
        title=f"Prefix caching: {args.num_requests} requests sharing {args.system_tokens} tokens",
    )
