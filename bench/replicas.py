"""Replicas: does a second engine replica behind Ray Serve double serving throughput?

Runs `hetero serve` three ways, one after another in one run, on the mock executor (no model):
the single-process server (the reference), one replica on a local Ray instance (`--ray-address
local`) and two replicas (`--replicas 2`). The mock executor's latency options make each engine step
cost fixed wall time (`--decode-latency` per step, `--prefill-latency` per prompt token) and
`--max-batch-size` caps the sequences per step, so one engine tops out at about
max_batch_size / decode_latency tokens/s whatever the CPU: the question is whether Ray Serve, the
frontend and the router let two engines deliver twice that. (The latency is a sleep, so on a
machine with fewer cores than replicas this measures the serving path, not compute; a real model
needs a device or cores per replica.)

Each configuration gets the same streaming /v1/completions workload as bench/serving_benchmark.py
(random printable-byte prompts, fixed output length, EOS ignored, at most C in flight). Prints a
table, the ratio of 2 to 1 replicas, how the requests split across replicas (the frontend's
/metrics), and writes a JSON file with the machine, versions and settings.

    .venv/bin/python bench/replicas.py [--concurrency 32] [--num-prompts 192] [--output-len 32]
        [--decode-latency 0.02] [--max-batch-size 8] [--json bench/results/replicas_mock_cpu.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

import httpx
from serving_benchmark import free_port, machine_info, run_level, summarize

STARTUP_TIMEOUT_S = 300
CONFIGS = {  # name -> hetero serve flags
    "single process": [],
    "ray, 1 replica": ["--ray-address", "local", "--replica-cpus", "0.5"],
    "ray, 2 replicas": ["--replicas", "2", "--replica-cpus", "0.5"],
}


def start(flags: list[str], env: dict, log) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "hetero_core", "serve", "--executor", "mock", "--port", str(port),
                                "--served-model-name", "mock", "--max-pending-requests", "4096", *flags],
                               env={**os.environ, **env}, stdout=log, stderr=log)
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"hetero serve {' '.join(flags)} exited with {process.returncode}")
        ray_config = "--ray-address" in flags or "--replicas" in flags  # ready once it prints "hetero: serving"
        with open(log.name) as output:
            ready = not ray_config or "hetero: serving" in output.read()
        try:
            if ready and httpx.get(base_url + "/health", timeout=2).status_code == 200:
                return process, base_url
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    process.kill()
    raise SystemExit("hetero serve did not become ready in time")


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(120)
    except subprocess.TimeoutExpired:
        process.kill()


def requests_per_replica(base_url: str) -> dict[str, int]:
    text = httpx.get(base_url + "/metrics").text
    return {m[1]: int(float(m[2])) for m in re.finditer(r'hetero_replica_requests_total\{replica="(\w+)"\} (\S+)', text)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--num-prompts", type=int, default=192)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--decode-latency", type=float, default=0.02, help="mock: seconds per step with decodes")
    parser.add_argument("--prefill-latency", type=float, default=0.0001, help="mock: seconds per prompt token")
    parser.add_argument("--max-batch-size", type=int, default=8, help="sequences per engine step")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="replicas.json")
    args = parser.parse_args()

    env = {"HETERO_EXECUTOR__MOCK__DECODE_LATENCY_PER_STEP": str(args.decode_latency),
           "HETERO_EXECUTOR__MOCK__PREFILL_LATENCY_PER_TOKEN": str(args.prefill_latency),
           "HETERO_MAX_BATCH_SIZE": str(args.max_batch_size), "HETERO_LOG_LEVEL": "warning"}
    rng = random.Random(args.seed)
    prompts = [[rng.randint(32, 126) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    results = {}
    for name in args.configs:
        with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
            process, base_url = start(CONFIGS[name], env, log)
            try:
                asyncio.run(run_level(base_url, "mock", prompts[:8], 4, 8, float("inf"), 0))  # warm-up
                before = requests_per_replica(base_url)
                outcome, duration = asyncio.run(run_level(base_url, "mock", prompts, args.output_len,
                                                          args.concurrency, float("inf"), args.seed))
                summary = summarize(outcome, duration, args.concurrency)
                after = requests_per_replica(base_url)
                summary["requests_per_replica"] = {r: n - before.get(r, 0) for r, n in after.items()}
                results[name] = summary
            finally:
                stop(process)
        print(f"{name}: {summary['completed']}/{args.num_prompts} in {duration:.1f}s", file=sys.stderr)

    print(f"{'configuration':<17} {'req/s':>7} {'out tok/s':>10} {'TTFT med ms':>12} {'TPOT med ms':>12}  split")
    for name, s in results.items():
        split = "/".join(str(n) for n in sorted(s["requests_per_replica"].values(), reverse=True)) or "-"
        print(f"{name:<17} {s['request_throughput']:>7.2f} {s['output_token_throughput']:>10.1f} "
              f"{s['ttft_ms']['median'] or 0:>12.0f} {s['tpot_ms']['median'] or 0:>12.1f}  {split}")
    ceiling = args.max_batch_size / args.decode_latency
    print(f"one engine's ceiling: about {ceiling:.0f} output tokens/s (max_batch_size / decode latency)")
    if "ray, 1 replica" in results and "ray, 2 replicas" in results:
        ratio = results["ray, 2 replicas"]["output_token_throughput"] / results["ray, 1 replica"]["output_token_throughput"]
        print(f"2 replicas / 1 replica: {ratio:.2f}x output tokens/s")
    report = {"machine": machine_info(), "settings": vars(args), "results": results}
    try:
        import ray

        report["machine"]["ray"] = ray.__version__
    except ImportError:
        pass
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2, default=str)
    print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
