"""Chunked prefill: inter-token latency of running decodes while long prompts arrive, chunking on vs off.

Workload (fixed, seed 0): 8 decode requests (64-token prompts, 96 output tokens each, greedy, EOS
ignored) start together; once they decode, 3 long prompts (1,536 random tokens, 4 output tokens) arrive
at steps 16, 40 and 64. Modes, same settings otherwise (max_model_len 4096, a token budget of 8,192 per
step, so an unchunked prompt runs whole in one step):
- ``chunked``: ``max_prefill_chunk = 256``, a long prompt is prefilled 256 tokens per step beside the
  decodes;
- ``unchunked``: no cap, the whole prompt in one step, and every decode waits for it.

Each decode's new tokens are timestamped when ``engine.step()`` returns them; the inter-token latency
(ITL) is the gap between consecutive tokens of one request. Reported: ITL p50 / p99 / max over all
decode tokens, the long prompts' time to first token, and the wall time. Real embedded SmolLM2-135M on
the CPU (torch executor). ``--repeats`` alternates the modes to expose drift on a shared machine.
A JSON copy with the machine (CPU model and flags) goes to --json.

    .venv/bin/python bench/chunked_prefill_latency.py [--chunk 256] [--long-tokens 1536] [--json FILE]
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

NUM_DECODES, DECODE_PROMPT, DECODE_TOKENS = 8, 64, 96
ARRIVAL_STEPS = (16, 40, 64)
INTERESTING_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_info() -> dict:
    model, flags = platform.processor(), []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = value.split()
                    break
    except OSError:
        pass
    return {"cpu": model, "flags": [f for f in INTERESTING_FLAGS if f in flags],
            "torch": torch.__version__, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads(), "python": platform.python_version()}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(chunk: int | None, long_tokens: int, model: str | None) -> dict:
    overrides = {"model": model} if model else {}
    settings = load_settings(executor="torch", max_model_len=4096, max_total_tokens=8192, max_prefill_chunk=chunk,
                             enable_prefix_caching=False, **overrides)
    engine = build_engine(settings, load_plugins(entry_points=[]))
    engine.generate([[100 + i for i in range(8)]], SamplingParams(temperature=0, max_tokens=2))  # warm-up
    rng = random.Random(0)
    decode_params = SamplingParams(temperature=0, max_tokens=DECODE_TOKENS, ignore_eos=True)
    long_params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    decodes = {engine.add_request([rng.randint(100, 20000) for _ in range(DECODE_PROMPT)], decode_params)
               for _ in range(NUM_DECODES)}
    longs = [[rng.randint(100, 20000) for _ in range(long_tokens)] for _ in ARRIVAL_STEPS]
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
    engine.shutdown()
    itl = [b - a for rid in decodes for a, b in zip(stamps[rid], stamps[rid][1:])]
    ttft = [long_first[rid] - long_arrival[rid] for rid in long_arrival]
    return {"mode": "chunked" if chunk else "unchunked", "max_prefill_chunk": chunk, "steps": step,
            "itl_p50_ms": 1e3 * percentile(itl, 0.5), "itl_p99_ms": 1e3 * percentile(itl, 0.99),
            "itl_max_ms": 1e3 * max(itl), "itl_mean_ms": 1e3 * statistics.fmean(itl), "num_itl": len(itl),
            "long_ttft_mean_s": statistics.fmean(ttft), "seconds": elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunk", type=int, default=256, help="max_prefill_chunk of the chunked mode")
    parser.add_argument("--long-tokens", type=int, default=1536, help="tokens of each long prompt")
    parser.add_argument("--model", help="model directory (default: the embedded SmolLM2)")
    parser.add_argument("--repeats", type=int, default=1, help="run both modes this many times, alternating")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    machine = cpu_info()
    print(f"machine: {machine['cpu']} ({', '.join(machine['flags'])}), torch {machine['torch']} "
          f"({machine['torch_cpu_capability']}, {machine['torch_threads']} threads), python {machine['python']}")
    print(f"{NUM_DECODES} decodes x {DECODE_TOKENS} tokens; {len(ARRIVAL_STEPS)} prompts of {args.long_tokens} "
          f"tokens arrive at steps {ARRIVAL_STEPS}")
    print(f"{'mode':<11}{'chunk':>7}{'steps':>7}{'ITL p50 ms':>12}{'ITL p99 ms':>12}{'ITL max ms':>12}"
          f"{'long TTFT s':>13}{'time s':>8}")
    results = []
    for chunk in (args.chunk, None) * args.repeats:
        r = run(chunk, args.long_tokens, args.model)
        results.append(r)
        print(f"{r['mode']:<11}{str(chunk or '-'):>7}{r['steps']:>7}{r['itl_p50_ms']:>12.1f}{r['itl_p99_ms']:>12.1f}"
              f"{r['itl_max_ms']:>12.1f}{r['long_ttft_mean_s']:>13.2f}{r['seconds']:>8.1f}")
    for on, off in zip(results[::2], results[1::2]):
        print(f"chunking on/off: ITL p99 {off['itl_p99_ms'] / on['itl_p99_ms']:.2f}x lower, "
              f"max {off['itl_max_ms'] / on['itl_max_ms']:.2f}x lower, p50 ratio {on['itl_p50_ms'] / off['itl_p50_ms']:.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": machine, "long_tokens": args.long_tokens, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
