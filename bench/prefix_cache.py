"""Prefix caching: requests sharing a long system prompt, with the prefix cache on vs off.

Workload (fixed): 32 requests, seed 0; each prompt is the same 512-token system prompt (random token
ids) followed by a unique question of 16-64 random tokens; 32 output tokens each, greedy, EOS ignored.
All requests are queued at once, then the engine runs to completion. Reported per mode: wall time,
output tokens/s, mean and p50 time to first token, prefix-cache hit rate; then the on/off ratios, and
a check that both modes produced the same tokens. A JSON copy goes to --json.

    .venv/bin/python bench/prefix_cache.py [--model DIR] [--num-requests 32] [--system-tokens 512]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time

import torch

from hetero_core.builder import build_engine
from hetero_core.engine.params import SamplingParams
from hetero_core.plugins import load_plugins
from hetero_core.settings import load_settings


def make_workload(num_requests: int, system_tokens: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randint(100, vocab_size - 1) for _ in range(system_tokens)]  # no special tokens
    return [system + [rng.randint(100, vocab_size - 1) for _ in range(rng.randint(16, 64))]
            for _ in range(num_requests)]


def run(model, prompts, output_tokens: int, caching: bool, threads: int | None) -> dict:
    overrides = {"model": model} if model else {}
    settings = load_settings(executor={"name": "torch", "torch": {"num_threads": threads}} if threads else "torch",
                             enable_prefix_caching=caching, max_model_len=2048, **overrides)
    engine = build_engine(settings, load_plugins(entry_points=[]))
    params = SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True)
    engine.generate([[100 + i for i in range(8)]], SamplingParams(temperature=0, max_tokens=2))  # warm-up
    before = engine.stats()
    start = time.perf_counter()
    outputs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    stats = engine.stats()
    engine.shutdown()
    ttft = [o.first_token_time - o.arrival_time for o in outputs]
    queried = stats.prefix_cache_queried_tokens - before.prefix_cache_queried_tokens
    hits = stats.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens
    num_tokens = sum(len(o.output_token_ids) for o in outputs)
    return {
        "prefix_caching": caching,
        "seconds": elapsed,
        "output_tokens_per_s": num_tokens / elapsed,
        "ttft_mean_s": statistics.fmean(ttft),
        "ttft_p50_s": statistics.median(ttft),
        "hit_tokens": hits,
        "queried_tokens": queried,
        "hit_rate": hits / queried if queried else 0.0,
        "tokens": [o.output_token_ids for o in outputs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="HF model directory (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--system-tokens", type=int, default=512)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", default="prefix_cache_bench.json", help="where to write the results")
    args = parser.parse_args()

    prompts = make_workload(args.num_requests, args.system_tokens, vocab_size=49152)
    results = [run(args.model, prompts, args.output_tokens, caching, args.threads) for caching in (False, True)]
    off, on = results
    print(f"machine: {platform.machine()} {platform.processor() or ''} torch threads={torch.get_num_threads()}, "
          f"python {platform.python_version()}, torch {torch.__version__}")
    print(f"workload: {len(prompts)} requests, {args.system_tokens}-token shared system prompt, "
          f"{sum(map(len, prompts))} prompt tokens, {args.output_tokens} output tokens each, greedy")
    print(f"{'prefix cache':<14}{'time s':>9}{'out tok/s':>11}{'TTFT mean s':>13}{'TTFT p50 s':>12}{'hit rate':>10}")
    for r in results:
        print(f"{'on' if r['prefix_caching'] else 'off':<14}{r['seconds']:>9.2f}{r['output_tokens_per_s']:>11.1f}"
              f"{r['ttft_mean_s']:>13.3f}{r['ttft_p50_s']:>12.3f}{r['hit_rate']:>10.1%}")
    print(f"ratio on/off: throughput {on['output_tokens_per_s'] / off['output_tokens_per_s']:.2f}x, "
          f"mean TTFT {off['ttft_mean_s'] / on['ttft_mean_s']:.2f}x lower")
    same = on["tokens"] == off["tokens"]
    print(f"same tokens with the cache on and off: {same}")
    record = {
        "machine": {"arch": platform.machine(), "python": platform.python_version(), "torch": torch.__version__,
                    "threads": torch.get_num_threads()},
        "settings": vars(args),
        "results": [{k: v for k, v in r.items() if k != "tokens"} for r in results],
        "same_tokens": same,
    }
    with open(args.json, "w") as f:
        json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
