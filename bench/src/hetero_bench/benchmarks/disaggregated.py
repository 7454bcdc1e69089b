"""Prefill/decode disaggregation: ``hetero serve --disaggregated`` (a prefill and a decode engine process
behind one front end) against ``hetero serve`` (one engine doing both), started in turn on the same
flags, modes alternating (``--repeats``).

Two phases per mode, over HTTP with streaming completions:
- ``alone``: ``--long-tokens``-token prompts one at a time (4 output tokens): time to first token; for
  the pair split into prefill, KV transfer (both from the front end's ``x-hetero-kv-transfer`` header)
  and the rest (first decode, front end and HTTP hops);
- ``mixed``: ``--num-decodes`` streams of ``--decode-tokens`` tokens start together; long prompts
  arrive among them every ``--interval`` seconds. Reported: the decodes' inter-token latency (gaps
  between streamed chunks) p50 / p99, and the long prompts' TTFT.

On a machine with few cores the two role processes share them: the pair then competes with itself
for the CPU and pays for it (the report says how many cores there were). Flags after ``--`` go to
``hetero serve`` (both modes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time

from hetero_bench.benchmarks.serving import free_port, stop_server, wait_until_healthy
from hetero_bench.options import add_engine_arguments, engine_flags, positive_float, positive_int
from hetero_bench.report import Column, Panel, Report, Table

SUMMARY = (
    "prefill/decode disaggregation vs one engine: TTFT split (prefill / transfer / rest), "
    "ITL under mixed load"
)
NEEDS = "hetero-bench[serving] (the server, httpx); torch and the model (--executor mock runs without them)"
WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
    "quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()
TIMEOUT_S = 600


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--long-tokens", type=positive_int, default=512, help="words of each long prompt (about tokens)"
    )
    parser.add_argument("--num-long", type=positive_int, default=3, help="long prompts per phase")
    parser.add_argument(
        "--num-decodes", type=positive_int, default=4, help="running decodes in the mixed phase"
    )
    parser.add_argument("--decode-tokens", type=positive_int, default=64, help="output tokens of each decode")
    parser.add_argument(
        "--interval", type=positive_float, default=1.0, help="seconds between long arrivals (mixed)"
    )
    parser.add_argument(
        "--repeats", type=positive_int, default=1, help="run both modes this many times, alternating"
    )
    add_engine_arguments(parser)
    parser.add_argument(
        "serve_flags", nargs="*", metavar="-- SERVE FLAGS", help="more flags for hetero serve"
    )


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def _stream(client, base: str, prompt: str, max_tokens: int) -> dict:
    body = {
        "model": "bench",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    start, stamps = time.perf_counter(), []
    async with client.stream("POST", base + "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        header = response.headers.get("x-hetero-kv-transfer")
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(f"stream error: {chunk['error']}")
                if chunk["choices"] and chunk["choices"][0].get("text"):
                    stamps.append(time.perf_counter())
    split = dict(part.split("=") for part in header.split(";")) if header else {}
    return {
        "ttft": stamps[0] - start if stamps else None,
        "itl": [b - a for a, b in zip(stamps, stamps[1:])],
        "prefill": float(split["prefill"]) if split else None,
        "transfer": float(split["transfer"]) if split else None,
    }


async def _phases(base: str, args) -> dict:
    import httpx

    rng = random.Random(0)
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        await _stream(client, base, _text(rng, 16), 2)  # warm-up
        alone = [await _stream(client, base, _text(rng, args.long_tokens), 4) for _ in range(args.num_long)]
        decodes = [
            asyncio.create_task(_stream(client, base, _text(rng, 32), args.decode_tokens))
            for _ in range(args.num_decodes)
        ]
        longs = []
        for _ in range(args.num_long):
            await asyncio.sleep(args.interval)
            longs.append(asyncio.create_task(_stream(client, base, _text(rng, args.long_tokens), 4)))
        decoded, mixed = await asyncio.gather(*decodes), await asyncio.gather(*longs)
    itl = [gap for d in decoded for gap in d["itl"]]
    mean = statistics.fmean
    row = {
        "ttft_alone_s": mean(a["ttft"] for a in alone),
        "itl_p50_ms": 1e3 * _percentile(itl, 0.5),
        "itl_p99_ms": 1e3 * _percentile(itl, 0.99),
        "ttft_mixed_s": mean(m["ttft"] for m in mixed),
    }
    if alone[0]["prefill"] is not None:
        row["prefill_s"] = mean(a["prefill"] for a in alone)
        row["transfer_s"] = mean(a["transfer"] for a in alone)
        row["rest_s"] = row["ttft_alone_s"] - row["prefill_s"] - row["transfer_s"]
    return row


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def run_mode(args, disaggregated: bool) -> dict:
    port = free_port()
    flags = engine_flags(args) + list(args.serve_flags) + (["--disaggregated"] if disaggregated else [])
    command = [
        sys.executable,
        "-m",
        "hetero_core",
        "serve",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--served-model-name",
        "bench",
        *flags,
    ]
    process = subprocess.Popen(command, stdout=sys.stderr, stderr=sys.stderr, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, base, "hetero serve")
        started = time.perf_counter()
        row = asyncio.run(_phases(base, args))
        row["seconds"] = time.perf_counter() - started
    finally:
        stop_server(process)
    return {"mode": "disaggregated" if disaggregated else "one engine", **row}


def run(args: argparse.Namespace) -> Report:
    rows = [run_mode(args, disaggregated) for _ in range(args.repeats) for disaggregated in (False, True)]
    columns = [
        Column("mode", "mode"),
        Column("ttft_alone_s", "TTFT alone s", ".3f"),
        Column("prefill_s", "prefill s", ".3f"),
        Column("transfer_s", "transfer s", ".4f"),
        Column("rest_s", "rest s", ".3f"),
        Column("ttft_mixed_s", "TTFT mixed s", ".3f"),
        Column("itl_p50_ms", "ITL p50 ms", ".1f"),
        Column("itl_p99_ms", "ITL p99 ms", ".1f"),
        Column("seconds", "time s", ".1f"),
    ]
    pairs = list(zip(rows[::2], rows[1::2]))
    ratios = [
        {
            "itl_p99_one_over_pair": one["itl_p99_ms"] / pair["itl_p99_ms"],
            "itl_p50_one_over_pair": one["itl_p50_ms"] / pair["itl_p50_ms"],
            "ttft_alone_pair_over_one": pair["ttft_alone_s"] / one["ttft_alone_s"],
        }
        for one, pair in pairs
    ]
    summary = [
        f"round {i + 1}: ITL p99 one/pair {r['itl_p99_one_over_pair']:.2f}x, "
        f"p50 {r['itl_p50_one_over_pair']:.2f}x; "
        f"TTFT alone pair/one {r['ttft_alone_pair_over_one']:.2f}x"
        for i, r in enumerate(ratios)
    ]
    header = [
        f"{args.num_long} prompts of ~{args.long_tokens} words alone, "
        f"then among {args.num_decodes} decodes x "
        f"{args.decode_tokens} tokens (one every {args.interval} s); executor {args.executor}; serve flags "
        f"{' '.join(args.serve_flags) or '(none)'}"
    ]
    one, pair = pairs[0]
    panels = [
        Panel(
            "decode inter-token latency under mixed load (first round)",
            "ms",
            ["p50", "p99"],
            {
                "one engine": [one["itl_p50_ms"], one["itl_p99_ms"]],
                "disaggregated": [pair["itl_p50_ms"], pair["itl_p99_ms"]],
            },
        ),
        Panel(
            "time to first token of a long prompt alone (first round)",
            "seconds",
            ["one engine", "disaggregated"],
            {
                "prefill": [one["ttft_alone_s"], pair["prefill_s"]],
                "transfer": [0.0, pair["transfer_s"]],
                "rest": [0.0, pair["rest_s"]],
            },
        ),
    ]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    return Report(
        "disaggregated",
        settings,
        Table(columns, rows),
        header,
        summary,
        {"ratios": ratios},
        panels,
        title=f"Disaggregation: ~{args.long_tokens}-word prompts among {args.num_decodes} decodes",
    )
