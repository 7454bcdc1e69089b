"""Structured output: what guided decoding costs per generated token, against the same requests free.

One engine; rounds alternate (free, guided, guided, free, ...): ``--num-requests`` requests of
``--max-tokens`` tokens each, all submitted at once, either free (``ignore_eos``, so they run to
``max_tokens``) or guided by a JSON schema (an object with one long string, so most run to
``max_tokens`` too). Measured: the process's CPU time per generated token (``time.process_time``:
every thread of this process, so neighbours on a shared machine do not inflate it), median over
rounds, and the difference: what the grammar's mask adds per token (xgrammar fills each constrained
row of the token bitmask; the sampler, or the mock executor, applies it).
"""

from __future__ import annotations

import argparse
import statistics
import time

from hetero_bench.options import add_engine_arguments, engine_settings, positive_int
from hetero_bench.report import Column, Panel, Report, Table
from hetero_core import HeteroError

SUMMARY = "per-token CPU cost of guided decoding (a JSON schema, xgrammar) against the same requests free"
NEEDS = "xgrammar (pip install 'hetero-core[structured]'); torch and the model unless --executor mock"
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 2000}},
    "required": ["answer"],
    "additionalProperties": False,
}
PROMPT = [{"role": "user", "content": "Tell a long story about a lighthouse keeper, as JSON."}]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--num-requests",
        type=positive_int,
        nargs="+",
        default=[1, 8],
        help="requests per round (batch sizes; default: 1 8)",
    )
    parser.add_argument(
        "--max-tokens", type=positive_int, default=64, help="tokens per request (default: 64)"
    )
    parser.add_argument("--rounds", type=positive_int, default=3, help="rounds of each kind (default: 3)")
    add_engine_arguments(parser)


def run(args: argparse.Namespace) -> Report:
    import importlib.util

    if importlib.util.find_spec("xgrammar") is None:
        raise HeteroError(
            "the structured-output benchmark needs xgrammar: pip install 'hetero-core[structured]'"
        )
    from hetero_core import LLM, SamplingParams

    llm = LLM.from_settings(engine_settings(args, max_model_len=1024, temperature=0.7))
    free = SamplingParams(temperature=0.7, max_tokens=args.max_tokens, ignore_eos=True, seed=0)
    guided = SamplingParams(
        temperature=0.7, max_tokens=args.max_tokens, seed=0, guided_decoding={"json": SCHEMA}
    )
    rows = []
    try:
        llm.engine.generate([PROMPT], guided)  # compiles the schema and starts the backend: not timed
        for num in args.num_requests:
            times = {"free": [], "guided": []}
            for i in range(2 * args.rounds):
                kind = ("free", "guided", "guided", "free")[i % 4]
                params = [free if kind == "free" else guided] * num
                start = time.process_time()
                outputs = llm.engine.generate([PROMPT] * num, params)
                seconds = time.process_time() - start
                failed = [o.error for o in outputs if o.error]
                if failed:
                    raise HeteroError(f"a {kind} request failed: {failed[0]}")
                times[kind].append(seconds / sum(len(o.output_token_ids) for o in outputs))
            f, g = (statistics.median(times[k]) * 1e6 for k in ("free", "guided"))
            rows.append(
                {"num_requests": num, "free_us": f, "guided_us": g, "added_us": g - f, "ratio": g / f}
            )
    finally:
        llm.shutdown()
    table = Table(
        [
            Column("num_requests", "requests"),
            Column("free_us", "free µs/token", ".0f"),
            Column("guided_us", "guided µs/token", ".0f"),
            Column("added_us", "added µs/token", ".0f"),
            Column("ratio", "ratio", ".2f", "x"),
        ],
        rows,
    )
    summary = [
        f"{r['num_requests']} request(s): guided decoding adds {r['added_us']:.0f} µs of CPU per token "
        f"({r['ratio']:.2f}x)"
        for r in rows
    ]
    panels = [
        Panel(
            "CPU time per generated token",
            "µs",
            [str(r["num_requests"]) for r in rows],
            {"free": [r["free_us"] for r in rows], "guided (JSON schema)": [r["guided_us"] for r in rows]},
            xlabel="requests at once",
        )
    ]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    header = [
        f"executor {args.executor}, {args.max_tokens} tokens per request, {args.rounds} rounds of each kind, "
        "temperature 0.7, process CPU time"
    ]
    return Report(
        "structured-output",
        settings,
        table,
        header,
        summary,
        {},
        panels,
        title="Structured output: CPU cost per token",
    )
