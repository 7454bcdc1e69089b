"""KV allocators: the same workload with `paged` and with `contiguous` (a max_model_len reservation each).

Workload (fixed by the seed): ``--num-requests`` requests queued at once; prompts of 16-512 random
token ids (32-250: valid for the byte tokenizer and SmolLM2); outputs of 16-256 tokens, greedy, EOS
ignored. Settings: max_model_len 2048, block size 16, 1,024 blocks (16,384 slots), up to 64
sequences per step (so the pool, not the batch size, bounds concurrency), prefix caching off.
Per allocator: KV waste (allocated slots not holding a computed token / allocated slots, after every
step, averaged: it depends on the schedule only), pool use, peak running requests, steps,
preemptions, output tokens per step and per second (the wall clock: machine-dependent). The mock
executor (default) is fast and deterministic; ``--executor torch`` runs the real model (use fewer
requests on a CPU).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from hetero_bench.options import add_engine_arguments, engine_settings, positive_int
from hetero_bench.report import Column, Panel, Report, Table

SUMMARY = "KV memory waste, concurrency and steps: paged vs contiguous allocation"
NEEDS = "hetero-plugins-mock (default executor); torch and the model with --executor torch"
SETTINGS = dict(
    max_model_len=2048, block_size=16, max_num_blocks=1024, max_batch_size=64, enable_prefix_caching=False
)
ALLOCATORS = ("paged", "contiguous")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-requests", type=positive_int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    add_engine_arguments(parser, default_executor="mock")


def make_workload(num_requests: int, seed: int = 0) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [
        ([rng.randint(32, 250) for _ in range(rng.randint(16, 512))], rng.randint(16, 256))
        for _ in range(num_requests)
    ]


def run_allocator(args, allocator: str, workload) -> dict:
    from hetero_core import LLM, SamplingParams

    llm = LLM.from_settings(engine_settings(args, kv_allocator=allocator, **SETTINGS))
    engine = llm.engine
    scheduler, pool = engine.scheduler, engine.scheduler.allocator
    for prompt, max_tokens in workload:
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    waste, used_fraction, peak, num_tokens = [], [], 0, 0
    start = time.perf_counter()
    try:
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
    finally:
        llm.shutdown()
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


def run(args: argparse.Namespace) -> Report:
    workload = make_workload(args.num_requests, args.seed)
    paged, static = rows = [run_allocator(args, allocator, workload) for allocator in ALLOCATORS]
    columns = [
        Column("allocator", "allocator"),
        Column("kv_waste_mean", "KV waste", ".1%"),
        Column("pool_allocated_mean", "pool used", ".1%"),
        Column("peak_running", "peak running"),
        Column("steps", "steps"),
        Column("preemptions", "preempt"),
        Column("output_tokens_per_step", "tok/step", ".1f"),
        Column("output_tokens_per_s", "tok/s", ".0f"),
    ]
    ratios = {
        "fewer_steps": static["steps"] / paged["steps"],
        "tokens_per_s": paged["output_tokens_per_s"] / static["output_tokens_per_s"],
        "peak_running": paged["peak_running"] / static["peak_running"],
    }
    summary = [
        f"paged / contiguous: {ratios['fewer_steps']:.2f}x fewer steps, {ratios['tokens_per_s']:.2f}x "
        f"tokens/s, {ratios['peak_running']:.1f}x peak running requests"
    ]
    header = [
        f"workload: {args.num_requests} requests, {sum(len(p) for p, _ in workload)} prompt + "
        f"{sum(m for _, m in workload)} output tokens, executor {args.executor}, {SETTINGS}"
    ]
    panels = [
        Panel(
            "KV memory waste (lower is better)",
            "% of allocated slots",
            list(ALLOCATORS),
            {"waste": [100 * r["kv_waste_mean"] for r in rows]},
        ),
        Panel(
            "peak running requests", "requests", list(ALLOCATORS), {"peak": [r["peak_running"] for r in rows]}
        ),
        Panel(
            "engine steps (lower is better)", "steps", list(ALLOCATORS), {"steps": [r["steps"] for r in rows]}
        ),
    ]
    settings = {**{k: v for k, v in vars(args).items() if k not in ("json", "plot")}, "engine": SETTINGS}
    return Report(
        "kv-allocators",
        settings,
        Table(columns, rows),
        header,
        summary,
        {"ratios": ratios},
        panels,
        title=f"KV allocators: {args.num_requests} requests, {args.executor} executor",
    )
