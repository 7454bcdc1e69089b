"""KV allocators: the same workload with `paged` and with `contiguous` (static max_model_len reservation).

Workload (fixed, seed 0): 64 requests queued at once; prompts of random token ids (32-250, valid for
the byte tokenizer and SmolLM2) of 16-512 tokens; outputs of 16-256 tokens, greedy, EOS ignored.
Settings: max_model_len 2048, block size 16, a pool of 1,024 blocks (16,384 slots), up to 64 sequences
per step (so the pool, not the batch size, bounds concurrency), prefix caching off for both (random
prompts share nothing anyway). Per allocator:

- KV memory waste: allocated slots not holding a computed token / allocated slots, measured after every
  step from the allocator and scheduler state (used blocks x block size vs the running sequences'
  computed tokens) and averaged over the steps. Deterministic: it depends on the schedule only.
- peak concurrent running requests, steps, preemptions;
- throughput: output tokens / s (wall clock, so it depends on the machine) and output tokens / step.

The mock executor (default) makes it fast and deterministic; ``--executor torch`` runs the real
embedded model (slow on a CPU: use fewer requests). A JSON copy goes to --json.

    .venv/bin/python bench/kv_allocators.py [--num-requests 64] [--executor mock|torch] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time

from hetero_core.builder import build_engine
from hetero_core.engine.params import SamplingParams
from hetero_core.plugins import load_plugins
from hetero_core.settings import load_settings

SETTINGS = dict(max_model_len=2048, block_size=16, max_num_blocks=1024, max_batch_size=64,
                enable_prefix_caching=False)


def make_workload(num_requests: int, seed: int = 0) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randint(32, 250) for _ in range(rng.randint(16, 512))], rng.randint(16, 256))
            for _ in range(num_requests)]


def build(allocator: str, executor: str):
    if executor == "mock":
        import hetero_plugins_mock

        plugins = load_plugins(entry_points=[], extra_plugins=[("mock", hetero_plugins_mock)])
    else:
        plugins = load_plugins(entry_points=[])
    return build_engine(load_settings(executor=executor, kv_allocator=allocator, **SETTINGS), plugins)


def run(allocator: str, executor: str, workload) -> dict:
    engine = build(allocator, executor)
    scheduler, pool = engine.scheduler, engine.scheduler.allocator
    for prompt, max_tokens in workload:
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    waste, used_fraction, peak, num_tokens = [], [], 0, 0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        num_tokens += sum(len(o.output_token_ids) for o in engine.step() if o.finished)
        allocated = pool.num_used_blocks * pool.block_size
        if allocated:
            held = sum(seq.num_computed_tokens for seq in scheduler.running)
            waste.append((allocated - held) / allocated)
            used_fraction.append(allocated / (pool.num_blocks * pool.block_size))
        peak = max(peak, len(scheduler.running))
    elapsed = time.perf_counter() - start
    stats = engine.stats()
    engine.shutdown()
    return {
        "allocator": allocator,
        "kv_waste_mean": statistics.fmean(waste),
        "pool_allocated_mean": statistics.fmean(used_fraction),
        "peak_running": peak,
        "steps": stats.num_steps,
        "preemptions": stats.num_preemptions,
        "output_tokens": num_tokens,
        "seconds": elapsed,
        "output_tokens_per_s": num_tokens / elapsed,
        "output_tokens_per_step": num_tokens / stats.num_steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--executor", default="mock", help="mock (default) or torch (the real model)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    workload = make_workload(args.num_requests)
    print(f"machine: {platform.machine()} {platform.processor() or ''}, python {platform.python_version()}, "
          f"executor {args.executor}, {args.num_requests} requests, "
          f"{sum(len(p) for p, _ in workload)} prompt + {sum(m for _, m in workload)} output tokens, {SETTINGS}")
    print(f"{'allocator':<12}{'KV waste':>10}{'pool used':>11}{'peak running':>14}{'steps':>8}"
          f"{'preempt':>9}{'tok/step':>10}{'tok/s':>10}")
    results = []
    for allocator in ("paged", "contiguous"):
        r = run(allocator, args.executor, workload)
        results.append(r)
        print(f"{allocator:<12}{r['kv_waste_mean']:>10.1%}{r['pool_allocated_mean']:>11.1%}{r['peak_running']:>14}"
              f"{r['steps']:>8}{r['preemptions']:>9}{r['output_tokens_per_step']:>10.1f}{r['output_tokens_per_s']:>10.0f}")
    paged, static = results
    print(f"paged / contiguous: {static['steps'] / paged['steps']:.2f}x fewer steps, "
          f"{paged['output_tokens_per_s'] / static['output_tokens_per_s']:.2f}x tokens/s, "
          f"{paged['peak_running'] / static['peak_running']:.1f}x peak running requests")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": platform.machine(), "python": platform.python_version(),
                       "executor": args.executor, "num_requests": args.num_requests, "settings": SETTINGS,
                       "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
