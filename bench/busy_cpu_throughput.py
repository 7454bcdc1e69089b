"""Decode throughput on the CPU with and without one other busy process.

Question: how much of its idle throughput does the torch executor keep when another process keeps
one core busy (`python -c 'while True: pass'`)? It loads the embedded model once through
`build_engine` (so the executor's own thread sizing and OpenMP settings are what is measured),
then alternates rounds: idle, then with a busy child process. Each round generates
`--max-tokens` tokens greedily for one prompt (batch 1, EOS ignored). Prints a table (median
tokens/s idle and busy, their ratio) and writes a JSON file with the machine, versions and settings.

    .venv/bin/python bench/busy_cpu_throughput.py [--rounds 5] [--max-tokens 32] [--num-threads N]
        [--json busy_cpu_throughput.json]

Environment variables (e.g. OMP_WAIT_POLICY=ACTIVE) apply: torch is imported by the engine, after
this script starts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from hetero_core.builder import build_engine
from hetero_core.engine.params import SamplingParams
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.settings import load_settings

PROMPT = "Once upon a time"
BUSY_LOOP = "while True: pass"


def cpu_facts() -> dict:
    """CPU model and flags from /proc/cpuinfo, and the CPUs this process may use."""
    facts = {"machine": platform.machine(), "cpus_allowed": len(os.sched_getaffinity(0)), "model": "?", "flags": ""}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name":
                    facts["model"] = value.strip()
                elif key == "flags":
                    facts["flags"] = " ".join(flag for flag in value.split() if flag.startswith(("avx", "fma", "amx")))
    except OSError:
        pass
    return facts


def tokens_per_second(engine, max_tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    [output] = engine.generate([PROMPT], params)
    return len(output.output_token_ids) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--num-threads", type=int, default=None, help="executor option (default: the executor's)")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()

    options = {} if args.num_threads is None else {"num_threads": args.num_threads}
    settings = load_settings(executor={"name": "torch", "torch": options}, max_num_blocks=64, log_level="warning")
    engine = build_engine(settings, load_plugins(entry_points=[]))
    import torch  # already loaded by the engine

    tokens_per_second(engine, 4)  # warm-up: oneDNN primitives, first-touch pages
    idle, busy = [], []
    for _ in range(args.rounds):
        idle.append(tokens_per_second(engine, args.max_tokens))
        child = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
        try:
            time.sleep(0.5)  # let the scheduler place it
            busy.append(tokens_per_second(engine, args.max_tokens))
        finally:
            child.kill()
            child.wait()
        time.sleep(0.5)
    engine.shutdown()

    result = {
        "cpu": cpu_facts(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "load_average_at_end": os.getloadavg(),
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "idle_tokens_per_s": idle,
        "busy_tokens_per_s": busy,
        "ratios": [b / i for i, b in zip(idle, busy)],
    }
    median_idle, median_busy = statistics.median(idle), statistics.median(busy)
    cpu = result["cpu"]
    print(f"cpu: {cpu['model']}, {cpu['cpus_allowed']} CPUs allowed, flags: {cpu['flags']}")
    print(f"python {result['python']}, torch {result['torch']}, intra-op threads {result['torch_threads']}, "
          f"OMP_WAIT_POLICY={result['omp_wait_policy']}, load average at end {result['load_average_at_end'][0]:.2f}")
    print(f"{'round':>5} {'idle tok/s':>11} {'busy tok/s':>11} {'ratio':>6}")
    for n, (i, b) in enumerate(zip(idle, busy), 1):
        print(f"{n:>5} {i:>11.1f} {b:>11.1f} {b / i:>6.2f}")
    print(f"{'median':>5} {median_idle:>11.1f} {median_busy:>11.1f} {median_busy / median_idle:>6.2f}"
          f"   (ratio of medians; median of ratios {statistics.median(result['ratios']):.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
