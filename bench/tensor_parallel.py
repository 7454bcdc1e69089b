"""Tensor parallelism on this machine: tokens/s of TP N against TP 1, same prompts, same run.

For each size it builds an engine on the model (the embedded SmolLM2-135M by default), warms it up
with one request, then times two workloads, counting only generation (not the start of the workers
or the loading): one request alone (decode latency) and a batch of requests together (throughput).
It also checks that every size gives TP 1's greedy tokens. On a CPU the ranks share its cores
(each gets cores // size threads), so this shows the cost of the collectives, not a speed-up: TP
pays off when each rank has a device (or cores) of its own.

    .venv/bin/python bench/tensor_parallel.py [--sizes 1 3] [--model DIR] [--prompts 8] [--tokens 32]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def measure(size: int, args) -> dict:
    from hetero_core import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    started = time.perf_counter()
    llm = LLM(args.model, executor="torch", tensor_parallel_size=size)
    loaded = time.perf_counter() - started
    try:
        llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=4))  # warm-up
        start = time.perf_counter()
        single = llm.generate([PROMPT], params)
        single_s = time.perf_counter() - start
        prompts = [f"{PROMPT} Version {i}." for i in range(args.prompts)]
        start = time.perf_counter()
        batch = llm.generate(prompts, params)
        batch_s = time.perf_counter() - start
    finally:
        llm.shutdown()
    return {
        "load_s": loaded,
        "single_tok_s": len(single[0].output_token_ids) / single_s,
        "batch_tok_s": sum(len(o.output_token_ids) for o in batch) / batch_s,
        "tokens": [o.output_token_ids for o in single + batch],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=8, help="requests in the batched workload")
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per request")
    args = parser.parse_args()
    sizes = sorted(set(args.sizes) | {1})
    results = {size: measure(size, args) for size in sizes}
    print(f"python {platform.python_version()}, {len(os.sched_getaffinity(0))} CPUs allowed, "
          f"load average {os.getloadavg()[0]:.2f}; model {args.model}; {args.tokens} tokens per request")
    base = results[1]
    print(f"{'TP':>3} {'load s':>7} {'1 request tok/s':>16} {'vs TP1':>7} "
          f"{f'{args.prompts} requests tok/s':>17} {'vs TP1':>7}  greedy tokens")
    for size, r in results.items():
        same = "same as TP1" if r["tokens"] == base["tokens"] else "DIFFER from TP1"
        single_ratio = r["single_tok_s"] / base["single_tok_s"]
        batch_ratio = r["batch_tok_s"] / base["batch_tok_s"]
        print(f"{size:>3} {r['load_s']:>7.1f} {r['single_tok_s']:>16.1f} {single_ratio:>6.2f}x "
              f"{r['batch_tok_s']:>17.1f} {batch_ratio:>6.2f}x  {same}")


if __name__ == "__main__":
    main()
