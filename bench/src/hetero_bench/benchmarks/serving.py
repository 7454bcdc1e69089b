"""Online serving: how throughput and latency scale with concurrent clients of `hetero serve`.

Starts ``hetero serve`` as a subprocess on a free loopback port (or uses ``--base-url``), then, for
each concurrency level, sends streaming ``/v1/completions`` (random-token prompts of
``--input-len``, ``--output-len`` output tokens, greedy, EOS ignored; 4 x C requests per level, at
least 8, unless ``--num-prompts``) with at most C in flight, or at a Poisson ``--request-rate``.
Reports TTFT, TPOT and ITL (mean / median / p99, vLLM's definitions: see serving_load.py),
throughput, and the scaling of output-token throughput from the lowest level to each higher one.
Flags after ``--`` go to ``hetero serve``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import random
import signal
import socket
import subprocess
import sys
import time

from hetero_bench.options import add_engine_arguments, engine_flags, positive_float, positive_int
from hetero_bench.report import Column, Panel, Report, Table
from hetero_core import HeteroError

SUMMARY = "`hetero serve` under 1..N concurrent streaming clients: TTFT, TPOT, ITL, tokens/s"
NEEDS = "hetero-bench[serving] (the server, httpx); torch and the model (--executor mock runs without them)"
STARTUP_TIMEOUT_S = 300
MOCK_VOCAB_HIGH = 257  # the byte tokenizer's last id (the mock executor runs without a model)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        nargs="+",
        default=[1, 8, 32],
        metavar="C",
        help="levels of clients in flight (default: 1 8 32)",
    )
    parser.add_argument(
        "--request-rate",
        type=positive_float,
        default=float("inf"),
        help="Poisson arrival rate in requests/s (default: inf, all at once)",
    )
    parser.add_argument(
        "--num-prompts", type=positive_int, help="requests per level (default: 4 x C, at least 8)"
    )
    parser.add_argument("--input-len", type=positive_int, default=128, help="prompt tokens (default: 128)")
    parser.add_argument("--output-len", type=positive_int, default=64, help="output tokens (default: 64)")
    parser.add_argument("--vocab-low", type=positive_int, default=100, help="random prompt ids from here")
    parser.add_argument(
        "--vocab-high",
        type=positive_int,
        help=f"... up to here (default: 49151; {MOCK_VOCAB_HIGH} with --executor mock)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base-url", help="benchmark a running server instead of starting hetero serve")
    add_engine_arguments(parser)
    parser.add_argument(
        "serve_flags", nargs="*", metavar="-- SERVE FLAGS", help="more flags for hetero serve"
    )


def run(args: argparse.Namespace) -> Report:
    if importlib.util.find_spec("httpx") is None:
        raise HeteroError("the serving benchmark needs httpx: pip install 'hetero-bench[serving]'")
    import httpx

    from hetero_bench.serving_load import run_level, summarize

    high = args.vocab_high or (MOCK_VOCAB_HIGH if args.executor == "mock" else 49151)
    if args.vocab_low > high:
        raise HeteroError(f"--vocab-low {args.vocab_low} is above the highest prompt id {high}")
    serve_flags = engine_flags(args) + list(args.serve_flags)
    process, base_url = (None, args.base_url) if args.base_url else start_server(serve_flags)
    levels = []
    try:
        model = httpx.get(base_url + "/v1/models").json()["data"][0]["id"]
        rng = random.Random(args.seed)
        warm_up = [[rng.randint(args.vocab_low, high)] * 8]
        asyncio.run(run_level(base_url, model, warm_up, 4, 1, float("inf"), args.seed))

        for concurrency in args.concurrency:
            num = args.num_prompts or max(8, 4 * concurrency)
            prompts = [[rng.randint(args.vocab_low, high) for _ in range(args.input_len)] for _ in range(num)]
            results, duration = asyncio.run(
                run_level(
                    base_url, model, prompts, args.output_len, concurrency, args.request_rate, args.seed
                )
            )
            levels.append(summarize(results, duration, concurrency))
            print(
                f"concurrency {concurrency}: {levels[-1]['completed']}/{num} in {duration:.1f}s",
                file=sys.stderr,
            )
    finally:
        if process is not None:
            stop_server(process)
    return _report(args, levels, model, serve_flags, high)


def start_server(serve_flags: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "hetero_core",
        "serve",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--max-pending-requests",
        "4096",
        *serve_flags,
    ]
    process = subprocess.Popen(command, stdout=sys.stderr, stderr=sys.stderr, stdin=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}"
    wait_until_healthy(process, base_url, "hetero serve")
    return process, base_url


def wait_until_healthy(
    process: subprocess.Popen,
    base_url: str,
    what: str,
    exit_detail=lambda: "its message is above",
    ready=lambda: True,
) -> None:
    """Poll ``base_url/health`` until it answers 200 once ``ready()`` holds. HeteroError when the
    server exits first (``exit_detail()`` says why) or is not ready in ``STARTUP_TIMEOUT_S``."""
    import httpx

    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise HeteroError(f"{what} exited with {process.returncode}: {exit_detail()}")
        try:
            if ready() and httpx.get(base_url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    process.kill()
    raise HeteroError(f"{what} did not become ready in {STARTUP_TIMEOUT_S} s")


def stop_server(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)  # a graceful stop, as a service manager does it
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _report(args, levels: list[dict], model: str, serve_flags: list[str], vocab_high: int) -> Report:
    rows = []
    for s in levels:
        row = {k: s[k] for k in ("concurrency", "completed", "request_throughput", "output_token_throughput")}
        for metric in ("ttft_ms", "tpot_ms", "itl_ms"):
            row[metric] = "/".join(
                "-" if s[metric][k] is None else f"{s[metric][k]:.0f}" for k in ("mean", "median", "p99")
            )
        rows.append(row)
    columns = [
        Column("concurrency", "conc"),
        Column("completed", "reqs"),
        Column("request_throughput", "req/s", ".2f"),
        Column("output_token_throughput", "out tok/s", ".1f"),
        Column("ttft_ms", "TTFT mean/med/p99 ms"),
        Column("tpot_ms", "TPOT mean/med/p99 ms"),
        Column("itl_ms", "ITL mean/med/p99 ms"),
    ]
    base = levels[0]["output_token_throughput"]
    scaling = {s["concurrency"]: s["output_token_throughput"] / base for s in levels[1:]} if base else {}
    summary = [
        f"scaling {levels[0]['concurrency']} -> {c} clients: {x:.2f}x output tokens/s"
        for c, x in scaling.items()
    ]
    failed = sum(s["failed"] for s in levels)
    if failed:
        summary.append(f"warning: {failed} request(s) failed: {[e for s in levels for e in s['errors']][:1]}")
    xs = [s["concurrency"] for s in levels]

    def series(metric):
        return {
            f"{metric.split('_')[0].upper()} {k}": [s[metric][k] for s in levels] for k in ("median", "p99")
        }

    panels = [
        Panel(
            "output throughput",
            "output tokens/s",
            xs,
            {"tokens/s": [s["output_token_throughput"] for s in levels]},
            kind="line",
            xlabel="concurrent clients",
            log_x=True,
        ),
        Panel(
            "time to first token",
            "ms",
            xs,
            series("ttft_ms"),
            kind="line",
            xlabel="concurrent clients",
            log_x=True,
        ),
        Panel(
            "inter-token latency",
            "ms",
            xs,
            series("itl_ms"),
            kind="line",
            xlabel="concurrent clients",
            log_x=True,
        ),
    ]
    header = [
        f"model {model}; prompts of {args.input_len} random tokens (ids {args.vocab_low}-{vocab_high}), "
        f"{args.output_len} output tokens, greedy, ignore_eos; request rate {args.request_rate}"
    ]
    settings = {
        **{k: v for k, v in vars(args).items() if k not in ("json", "plot", "serve_flags")},
        "serve_flags": serve_flags,
        "served_model": model,
        "vocab_high": vocab_high,
    }
    return Report(
        "serving",
        settings,
        Table(columns, rows),
        header,
        summary,
        {"levels": levels, "scaling": scaling},
        panels,
        title=f"hetero serve: {args.input_len}-token prompts, {args.output_len} output tokens",
    )
