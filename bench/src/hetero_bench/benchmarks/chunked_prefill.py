"""Chunked prefill: inter-token latency of running decodes while long prompts arrive, chunking on vs off.

Workload (fixed, seed 0): 8 decode requests (64-token prompts, 96 output tokens each, greedy, EOS
ignored) start together; once they decode, 3 long prompts (``--long-tokens`` random tokens, 4 output
tokens) arrive at steps 16, 40 and 64. Modes, same settings otherwise (max_model_len 4096, a token
budget of 8,192 per step, so an unchunked prompt runs whole in one step):
- ``chunked``: ``max_prefill_chunk = --chunk``: a long prompt is prefilled that many tokens per step
  beside the decodes;
- ``unchunked``: no cap: the whole prompt in one step, and every decode waits for it.

Each decode's new tokens are timestamped when ``engine.step()`` returns them; the inter-token
latency (ITL) is the gap between consecutive tokens of one request. Reported: ITL p50 / p99 / max
over all decode tokens, the long prompts' time to first token, the wall time. ``--repeats``
alternates the modes to expose drift on a shared machine.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from hetero_bench.options import add_engine_arguments, engine_settings, positive_int
from hetero_bench.report import Column, Panel, Report, Table

SUMMARY = "decode inter-token latency while long prompts arrive, chunked prefill on vs off"
NEEDS = "torch and the model (--executor mock runs without them)"
NUM_DECODES, DECODE_PROMPT, DECODE_TOKENS = 8, 64, 96
ARRIVAL_STEPS = (16, 40, 64)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--chunk", type=positive_int, default=256, help="max_prefill_chunk of the chunked mode"
    )
    parser.add_argument("--long-tokens", type=positive_int, default=1536, help="tokens of each long prompt")
    parser.add_argument(
        "--repeats", type=positive_int, default=1, help="run both modes this many times, alternating"
    )
    add_engine_arguments(parser)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_mode(args, chunk: int | None) -> dict:
    from hetero_core import LLM, SamplingParams

    settings = engine_settings(
        args, max_model_len=4096, max_total_tokens=8192, max_prefill_chunk=chunk, enable_prefix_caching=False
    )
    llm = LLM.from_settings(settings)
    engine = llm.engine
    try:
        high = min(20000, engine.tokenizer.vocab_size - 1)
        engine.generate([[100 + i for i in range(8)]], SamplingParams(temperature=0, max_tokens=2))  # warm-up
        rng = random.Random(0)
        decode_params = SamplingParams(temperature=0, max_tokens=DECODE_TOKENS, ignore_eos=True)
        long_params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        decodes = {
            engine.add_request([rng.randint(100, high) for _ in range(DECODE_PROMPT)], decode_params)
            for _ in range(NUM_DECODES)
        }
        longs = [[rng.randint(100, high) for _ in range(args.long_tokens)] for _ in ARRIVAL_STEPS]
        stamps: dict[str, list[float]] = {}
        long_arrival, long_first = {}, {}
        step = 0
        start = time.perf_counter()
        while engine.has_unfinished_requests() or step <= ARRIVAL_STEPS[-1]:
            if step in ARRIVAL_STEPS:
                request_id = engine.add_request(longs[ARRIVAL_STEPS.index(step)], long_params)
                long_arrival[request_id] = time.perf_counter()
            outputs = engine.step()
            now = time.perf_counter()
            for out in outputs:
                times = stamps.setdefault(out.request_id, [])
                times += [now] * (len(out.output_token_ids) - len(times))
                if out.request_id in long_arrival and out.output_token_ids:
                    long_first.setdefault(out.request_id, now)
            step += 1
        elapsed = time.perf_counter() - start
    finally:
        llm.shutdown()
    itl = [b - a for rid in decodes for a, b in zip(stamps[rid], stamps[rid][1:])]
    ttft = [long_first[rid] - long_arrival[rid] for rid in long_arrival]
    return {
        "mode": "chunked" if chunk else "unchunked",
        "max_prefill_chunk": chunk,
        "steps": step,
        "itl_p50_ms": 1e3 * percentile(itl, 0.5),
        "itl_p99_ms": 1e3 * percentile(itl, 0.99),
        "itl_max_ms": 1e3 * max(itl),
        "itl_mean_ms": 1e3 * statistics.fmean(itl),
        "num_itl": len(itl),
        "long_ttft_mean_s": statistics.fmean(ttft),
        "seconds": elapsed,
    }


def run(args: argparse.Namespace) -> Report:
    rows = [run_mode(args, chunk) for chunk in (args.chunk, None) * args.repeats]
    columns = [
        Column("mode", "mode"),
        Column("max_prefill_chunk", "chunk"),
        Column("steps", "steps"),
        Column("itl_p50_ms", "ITL p50 ms", ".1f"),
        Column("itl_p99_ms", "ITL p99 ms", ".1f"),
        Column("itl_max_ms", "ITL max ms", ".1f"),
        Column("long_ttft_mean_s", "long TTFT s", ".2f"),
        Column("seconds", "time s", ".1f"),
    ]
    pairs = list(zip(rows[::2], rows[1::2]))
    ratios = [
        {
            "itl_p99_lower": off["itl_p99_ms"] / on["itl_p99_ms"],
            "itl_max_lower": off["itl_max_ms"] / on["itl_max_ms"],
            "itl_p50_on_over_off": on["itl_p50_ms"] / off["itl_p50_ms"],
        }
        for on, off in pairs
    ]
    summary = [
        f"chunking on/off: ITL p99 {r['itl_p99_lower']:.2f}x lower, max {r['itl_max_lower']:.2f}x lower, "
        f"p50 ratio {r['itl_p50_on_over_off']:.2f}"
        for r in ratios
    ]
    header = [
        f"{NUM_DECODES} decodes x {DECODE_TOKENS} tokens; {len(ARRIVAL_STEPS)} prompts of {args.long_tokens} "
        f"tokens arrive at steps {ARRIVAL_STEPS}; executor {args.executor}"
    ]
    on, off = pairs[0]
    labels = [f"chunked ({args.chunk})", "unchunked"]
    panels = [
        Panel(
            "decode inter-token latency (first pair)",
            "ms",
            ["p50", "p99", "max"],
            {
                label: [r["itl_p50_ms"], r["itl_p99_ms"], r["itl_max_ms"]]
                for label, r in zip(labels, (on, off))
            },
        ),
        Panel(
            "long prompts' time to first token",
            "seconds",
            labels,
            {"TTFT": [on["long_ttft_mean_s"], off["long_ttft_mean_s"]]},
        ),
    ]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    return Report(
        "chunked-prefill",
        settings,
        Table(columns, rows),
        header,
        summary,
        {"ratios": ratios},
        panels,
        title=(
            f"Chunked prefill: {NUM_DECODES} decodes, "
            f"{len(ARRIVAL_STEPS)} x {args.long_tokens}-token arrivals"
        ),
    )
