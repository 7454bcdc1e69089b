"""Replicas: does a second engine replica behind Ray Serve double serving throughput?

Runs ``hetero serve`` three ways, one after another: the single-process server (the reference), one
replica on a local Ray instance (``--ray-address local``) and two replicas (``--replicas 2``), on the
mock executor. Its latency options make each engine step cost fixed wall time (``--decode-latency``
per step with decodes, ``--prefill-latency`` per prompt token) and ``--max-batch-size`` caps the
sequences per step, so one engine tops out at about max_batch_size / decode_latency output tokens/s
whatever the CPU: the question is whether Ray Serve, the frontend and the router let two engines
deliver twice that. The latency is a sleep, so on a machine with fewer cores than replicas this
measures the serving path, not compute.

Each configuration gets the same streaming ``/v1/completions`` workload as ``hetero bench serving``
(random printable-byte prompts, fixed output length, EOS ignored, at most C in flight). Reports
each one's throughput and latencies, how the requests split across replicas (the frontend's
/metrics), and the ratio of 2 replicas to 1.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import random
import re
import signal
import subprocess
import sys
import tempfile

from hetero_bench.options import positive_float, positive_int
from hetero_bench.report import Column, Panel, Report, Table
from hetero_core import HeteroError

SUMMARY = "1 vs 2 engine replicas behind Ray Serve (and the single-process server): tokens/s and the ratio"
NEEDS = "hetero-bench[replicas] (Ray Serve, httpx); the mock executor (no torch, no model)"
INSTALL = "pip install 'hetero-bench[replicas]'"
CONFIGS = {  # name -> hetero serve flags
    "single process": [],
    "ray, 1 replica": ["--ray-address", "local", "--replica-cpus", "0.5"],
    "ray, 2 replicas": ["--replicas", "2", "--replica-cpus", "0.5"],
}
PRINTABLE = (32, 126)  # prompt ids: printable bytes of the mock executor's byte tokenizer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency", type=positive_int, default=32, help="clients in flight (default: 32)"
    )
    parser.add_argument(
        "--num-prompts", type=positive_int, default=192, help="requests per configuration (default: 192)"
    )
    parser.add_argument("--input-len", type=positive_int, default=64, help="prompt tokens (default: 64)")
    parser.add_argument("--output-len", type=positive_int, default=32, help="output tokens (default: 32)")
    parser.add_argument(
        "--decode-latency",
        type=positive_float,
        default=0.02,
        help="mock executor: seconds per step with decodes (default: 0.02)",
    )
    parser.add_argument(
        "--prefill-latency",
        type=float,
        default=0.0001,
        help="mock executor: seconds per prompt token (default: 0.0001)",
    )
    parser.add_argument(
        "--max-batch-size", type=positive_int, default=8, help="sequences per engine step (default: 8)"
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        default=list(CONFIGS),
        choices=list(CONFIGS),
        metavar="NAME",
        help=f"which to run, of: {', '.join(repr(c) for c in CONFIGS)} (default: all)",
    )
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> Report:
    if importlib.util.find_spec("httpx") is None:
        raise HeteroError(f"the replicas benchmark needs httpx: {INSTALL}")
    if any(CONFIGS[c] for c in args.configs) and importlib.util.find_spec("ray") is None:
        raise HeteroError("replicas run on Ray Serve: pip install 'hetero-core[ray]'")
    from hetero_bench.serving_load import run_level, summarize

    env = {
        "HETERO_EXECUTOR__MOCK__DECODE_LATENCY_PER_STEP": str(args.decode_latency),
        "HETERO_EXECUTOR__MOCK__PREFILL_LATENCY_PER_TOKEN": str(args.prefill_latency),
        "HETERO_MAX_BATCH_SIZE": str(args.max_batch_size),
        "HETERO_LOG_LEVEL": "warning",
    }
    rng = random.Random(args.seed)
    prompts = [[rng.randint(*PRINTABLE) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    results = {}
    for name in args.configs:
        with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
            process, base_url = _start(CONFIGS[name], env, log)
            try:
                asyncio.run(
                    run_level(base_url, "mock", prompts[:8], 4, 8, float("inf"), args.seed)
                )  # warm-up
                before = _requests_per_replica(base_url)
                outcome, duration = asyncio.run(
                    run_level(
                        base_url, "mock", prompts, args.output_len, args.concurrency, float("inf"), args.seed
                    )
                )
                summary = summarize(outcome, duration, args.concurrency)
                after = _requests_per_replica(base_url)
                summary["requests_per_replica"] = {r: n - before.get(r, 0) for r, n in after.items()}
                results[name] = summary
            finally:
                _stop(process)
        print(f"{name}: {summary['completed']}/{args.num_prompts} in {duration:.1f}s", file=sys.stderr)
    return _report(args, results)


def _start(flags: list[str], env: dict, log) -> tuple[subprocess.Popen, str]:
    from hetero_bench.benchmarks.serving import free_port, wait_until_healthy

    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hetero_core",
            "serve",
            "--executor",
            "mock",
            "--port",
            str(port),
            "--served-model-name",
            "mock",
            "--max-pending-requests",
            "4096",
            *flags,
        ],
        env={**os.environ, **env},
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
    )
    base_url = f"http://127.0.0.1:{port}"

    def log_text() -> str:
        with open(log.name) as output:
            return output.read()

    # on Ray, ready once every replica runs: it then says "hetero: serving"
    wait_until_healthy(
        process,
        base_url,
        f"hetero serve {' '.join(flags)}",
        exit_detail=lambda: (log_text().strip().splitlines() or ["(no output)"])[-1],
        ready=lambda: not flags or "hetero: serving" in log_text(),
    )
    return process, base_url


def _stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(120)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _requests_per_replica(base_url: str) -> dict[str, int]:
    import httpx

    text = httpx.get(base_url + "/metrics").text
    return {
        m[1]: int(float(m[2]))
        for m in re.finditer(r'hetero_replica_requests_total\{replica="(\w+)"\} (\S+)', text)
    }


def _report(args, results: dict[str, dict]) -> Report:
    rows = [
        {
            "configuration": name,
            "completed": s["completed"],
            "request_throughput": s["request_throughput"],
            "output_token_throughput": s["output_token_throughput"],
            "ttft_median_ms": s["ttft_ms"]["median"],
            "tpot_median_ms": s["tpot_ms"]["median"],
            "split": "/".join(str(n) for n in sorted(s["requests_per_replica"].values(), reverse=True))
            or "-",
        }
        for name, s in results.items()
    ]
    columns = [
        Column("configuration", "configuration"),
        Column("completed", "reqs"),
        Column("request_throughput", "req/s", ".2f"),
        Column("output_token_throughput", "out tok/s", ".1f"),
        Column("ttft_median_ms", "TTFT med ms", ".0f"),
        Column("tpot_median_ms", "TPOT med ms", ".1f"),
        Column("split", "requests per replica"),
    ]
    ceiling = args.max_batch_size / args.decode_latency
    summary = [f"one engine's ceiling: about {ceiling:.0f} output tokens/s (max_batch_size / decode latency)"]
    ratio = None
    if "ray, 1 replica" in results and "ray, 2 replicas" in results:
        one = results["ray, 1 replica"]["output_token_throughput"]
        ratio = results["ray, 2 replicas"]["output_token_throughput"] / one if one else None
        if ratio is not None:
            summary.append(f"2 replicas / 1 replica: {ratio:.2f}x output tokens/s")
    failed = sum(s["failed"] for s in results.values())
    if failed:
        summary.append(
            f"warning: {failed} request(s) failed: {[e for s in results.values() for e in s['errors']][:1]}"
        )
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    header = [
        f"workload: {args.num_prompts} requests per configuration, {args.concurrency} in flight, "
        f"{args.input_len}-token prompts, {args.output_len} output tokens; mock executor at "
        f"{args.decode_latency * 1000:g} ms per decode step, batches of at most {args.max_batch_size}"
    ]
    panel = Panel(
        "output tokens/s",
        "tokens/s",
        list(results),
        {"output tokens/s": [s["output_token_throughput"] for s in results.values()]},
    )
    return Report(
        "replicas",
        settings,
        Table(columns, rows),
        header=header,
        summary=summary,
        results={"configurations": results, "ratio_2_to_1": ratio},
        panels=[panel],
        title="hetero serve: replicas behind Ray Serve (mock executor)",
    )
