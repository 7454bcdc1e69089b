"""Online serving: how throughput and latency scale with concurrent clients of `hetero serve`.

Starts `hetero serve` as a subprocess on a free loopback port (or uses --base-url), then, for each
concurrency level, sends a bounded number of streaming completions (random-token prompts, fixed
output length, greedy, EOS ignored) either with at most C in flight or at a Poisson request rate.
Metrics follow vLLM's serving benchmark (benchmarks/serve.py):

- TTFT: request sent to first streamed token; E2E: request sent to last chunk.
- TPOT per request: (E2E - TTFT) / (output tokens - 1), for requests with more than one token.
- ITL: the gaps between consecutive streamed chunks, pooled over all requests.
- request throughput: completed requests / wall time of the run; output token throughput: output
  tokens (the server's usage counts) / wall time; total token throughput adds the prompt tokens.

Prints a table and the scaling ratio of output-token throughput between the lowest and each higher
concurrency, and writes a JSON file with the machine, versions and settings.

    .venv/bin/python bench/serving_benchmark.py [--concurrency 1 8 32] [--request-rate inf]
        [--input-len 128] [--output-len 64] [--num-prompts N] [--json out.json] [-- SERVE FLAGS...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

import httpx

STARTUP_TIMEOUT_S = 300
REQUEST_TIMEOUT_S = 600


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itls: list[float] = field(default_factory=list)
    error: str = ""


async def send_one(client: httpx.AsyncClient, base_url: str, model: str, prompt: list[int],
                   output_len: int) -> RequestResult:
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    last = None
    result = RequestResult(ok=False)
    try:
        async with client.stream("POST", base_url + "/v1/completions", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                now = time.perf_counter()
                if "error" in chunk:
                    result.error = chunk["error"]["message"]
                    return result
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if any(c.get("text") for c in chunk["choices"]):
                    if last is None:
                        result.ttft = now - start
                    else:
                        result.itls.append(now - last)
                    last = now
        result.e2e = time.perf_counter() - start
        result.ok = result.output_tokens > 0
    except httpx.HTTPError as exc:
        result.error = repr(exc)
    return result


async def run_level(base_url: str, model: str, prompts: list[list[int]], output_len: int, concurrency: int,
                    request_rate: float, seed: int) -> tuple[list[RequestResult], float]:
    limit = asyncio.Semaphore(concurrency)
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        async def limited(prompt):
            async with limit:
                return await send_one(client, base_url, model, prompt, output_len)

        start = time.perf_counter()
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.create_task(limited(prompt)))
            if request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(request_rate))
        results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - start


def summarize(results: list[RequestResult], duration: float, concurrency: int) -> dict:
    done = [r for r in results if r.ok]
    ms = 1000.0

    def stats(values: list[float]) -> dict:
        if not values:
            return {"mean": None, "median": None, "p99": None}
        ordered = sorted(values)
        p99 = ordered[min(len(ordered) - 1, max(0, int(round(0.99 * len(ordered) + 0.5)) - 1))]
        return {"mean": statistics.fmean(values) * ms, "median": statistics.median(values) * ms, "p99": p99 * ms}

    output_tokens = sum(r.output_tokens for r in done)
    prompt_tokens = sum(r.prompt_tokens for r in done)
    tpots = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    return {
        "concurrency": concurrency,
        "num_requests": len(results),
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": sorted({r.error for r in results if not r.ok})[:3],
        "duration_s": duration,
        "request_throughput": len(done) / duration,
        "output_token_throughput": output_tokens / duration,
        "total_token_throughput": (output_tokens + prompt_tokens) / duration,
        "output_tokens": output_tokens,
        "prompt_tokens": prompt_tokens,
        "ttft_ms": stats([r.ttft for r in done]),
        "tpot_ms": stats(tpots),
        "itl_ms": stats([gap for r in done for gap in r.itls]),
        "e2e_ms": stats([r.e2e for r in done]),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(serve_args: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "hetero_core", "serve", "--port", str(port), "--log-level", "warning",
               "--max-pending-requests", "4096", *serve_args]
    process = subprocess.Popen(command, stdout=sys.stderr, stderr=sys.stderr)
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"hetero serve exited with {process.returncode}")
        try:
            if httpx.get(base_url + "/health", timeout=2).status_code == 200:
                return process, base_url
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    process.kill()
    raise SystemExit("hetero serve did not become healthy in time")


def machine_info() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        pass
    for name in ("fastapi", "uvicorn", "httpx"):
        try:
            info[name] = __import__(name).__version__
        except (ImportError, AttributeError):
            pass
    return info


def print_table(levels: list[dict]) -> None:
    header = (f"{'conc':>5} {'reqs':>5} {'req/s':>7} {'out tok/s':>10} {'TTFT mean/med/p99 ms':>24} "
              f"{'TPOT mean/med/p99 ms':>22} {'ITL mean/med/p99 ms':>22}")
    print(header)
    for s in levels:
        def fmt(m):
            return "/".join("-" if m[k] is None else f"{m[k]:.0f}" for k in ("mean", "median", "p99"))

        print(f"{s['concurrency']:>5} {s['completed']:>5} {s['request_throughput']:>7.2f} "
              f"{s['output_token_throughput']:>10.1f} {fmt(s['ttft_ms']):>24} {fmt(s['tpot_ms']):>22} "
              f"{fmt(s['itl_ms']):>22}")
    base = levels[0]["output_token_throughput"]
    for s in levels[1:]:
        print(f"scaling {levels[0]['concurrency']} -> {s['concurrency']} clients: "
              f"{s['output_token_throughput'] / base:.2f}x output tokens/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="use a running server instead of starting hetero serve")
    parser.add_argument("--model", help="model id to send (default: the server's first model)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--request-rate", type=float, default=float("inf"), help="Poisson rate (req/s); inf: all at once")
    parser.add_argument("--num-prompts", type=int, help="requests per level (default: 4 x concurrency, at least 8)")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--vocab-low", type=int, default=100, help="random prompt ids from here (skip special tokens)")
    parser.add_argument("--vocab-high", type=int, default=49151)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="serving_benchmark.json")
    parser.add_argument("serve_args", nargs=argparse.REMAINDER, help="after --: flags for hetero serve")
    args = parser.parse_args()
    serve_args = [a for a in args.serve_args if a != "--"]

    process = None
    base_url = args.base_url
    if base_url is None:
        process, base_url = start_server(serve_args)
    try:
        model = args.model or httpx.get(base_url + "/v1/models").json()["data"][0]["id"]
        rng = random.Random(args.seed)
        asyncio.run(run_level(base_url, model, [[rng.randint(args.vocab_low, args.vocab_high)] * 8], 4, 1,
                              float("inf"), 0))  # warm-up
        levels = []
        for concurrency in args.concurrency:
            num = args.num_prompts or max(8, 4 * concurrency)
            prompts = [[rng.randint(args.vocab_low, args.vocab_high) for _ in range(args.input_len)]
                       for _ in range(num)]
            results, duration = asyncio.run(run_level(base_url, model, prompts, args.output_len, concurrency,
                                                      args.request_rate, args.seed))
            levels.append(summarize(results, duration, concurrency))
            print(f"concurrency {concurrency}: {levels[-1]['completed']}/{num} in {duration:.1f}s", file=sys.stderr)
    finally:
        if process is not None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
    print_table(levels)
    report = {"machine": machine_info(), "settings": {**{k: v for k, v in vars(args).items() if k != "serve_args"},
                                                      "serve_args": serve_args, "model": model}, "levels": levels}
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2, default=str)
    print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
