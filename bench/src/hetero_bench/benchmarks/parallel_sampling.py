"""Parallel sampling: n completions of one prompt as ``SamplingParams(n=N)`` (the prompt's KV blocks
shared) against its peer, N identical requests queued together (N prefills: what the server's ``n``
did before issue 27).

Workload: ``--rounds`` rounds; in each, each arm gets a new prompt of ``--prompt-tokens`` random
token ids (so nothing is found in the prefix cache from before), ``--n`` completions of
``--output-tokens`` tokens, greedy, EOS ignored; the two arms alternate which goes first. Reported
per arm: the median wall time, the tokens the executor ran (counted on the batches: prompt tokens
computed, plus one per decode) and whether its n greedy completions came out equal; then the
per-round time ratios.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from hetero_bench.options import add_engine_arguments, engine_settings, positive_int
from hetero_bench.report import Column, Report, Table

SUMMARY = "n completions of a prompt: SamplingParams(n) sharing its blocks vs n identical requests"
NEEDS = "torch and the model (--executor mock runs without them)"
ARMS = ("n", "n requests")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=positive_int, default=4, help="completions per prompt")
    parser.add_argument("--prompt-tokens", type=positive_int, default=512)
    parser.add_argument("--output-tokens", type=positive_int, default=16)
    parser.add_argument("--rounds", type=positive_int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    add_engine_arguments(parser)


def run(args: argparse.Namespace) -> Report:
    from hetero_core import LLM, SamplingParams

    llm = LLM.from_settings(engine_settings(args, enable_prefix_caching=True))
    engine, counted = llm.engine, []
    execute = engine.executor.execute

    def counting(batch):
        counted.append(batch.num_tokens)
        return execute(batch)

    engine.executor.execute = counting
    rng = random.Random(args.seed)
    params = dict(temperature=0, max_tokens=args.output_tokens, ignore_eos=True)
    seconds = {arm: [] for arm in ARMS}
    tokens, equal = {}, {arm: True for arm in ARMS}
    try:
        high = engine.tokenizer.vocab_size - 1
        for r in range(args.rounds):
            for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
                prompt = [
                    rng.randint(100, high) for _ in range(args.prompt_tokens)
                ]  # ids from 100: no specials
                counted.clear()
                start = time.perf_counter()
                if arm == "n":
                    [out] = engine.generate([prompt], SamplingParams(**params, n=args.n))
                    made = [c.token_ids for c in out.outputs]
                else:
                    made = [
                        o.output_token_ids
                        for o in engine.generate([prompt] * args.n, SamplingParams(**params))
                    ]
                seconds[arm].append(time.perf_counter() - start)
                tokens[arm] = sum(counted)
                equal[arm] = equal[arm] and all(m == made[0] for m in made)
    finally:
        llm.shutdown()
    rows = [
        {
            "arm": f"SamplingParams(n={args.n})" if arm == "n" else f"{args.n} requests of n=1",
            "median_s": statistics.median(seconds[arm]),
            "executor_tokens": tokens[arm],
            "equal_completions": equal[arm],
        }
        for arm in ARMS
    ]
    ratios = [b / a for a, b in zip(seconds["n"], seconds["n requests"])]
    columns = [
        Column("arm", "arm"),
        Column("median_s", "median s", ".3f"),
        Column("executor_tokens", "executor tokens (last round)"),
        Column("equal_completions", "greedy completions equal"),
    ]
    summary = [f"time, n requests / SamplingParams(n), per round: {', '.join(f'{x:.2f}' for x in ratios)}"]
    header = [
        f"workload: {args.rounds} rounds, a {args.prompt_tokens}-token prompt, n={args.n}, "
        f"{args.output_tokens} output tokens each, greedy"
    ]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    return Report(
        "parallel-sampling",
        settings,
        Table(columns, rows),
        header,
        summary,
        {"time_ratios": ratios},
        [],
        title=f"Parallel sampling: n={args.n} completions of a {args.prompt_tokens}-token prompt",
    )
