"""Warm start: how long until `hetero run` has its first token, with the model already converted.

Runs `hetero run --max-tokens 1 --temperature 0 PROMPT` in a fresh subprocess several times (the
cache in ~/.cache/hetero or $HETERO_CACHE_DIR is converted first, untimed) and reports the median
wall time from process start to exit: an upper bound on time-to-first-token that includes the
interpreter's start, every import, loading the weights, the prefill and the exit.

    .venv/bin/python bench/warm_start.py [--runs 7] [--json warm_start.json] [-- extra hetero run flags]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

PROMPT = "What is the capital of France?"


def hetero_command() -> list[str]:
    script = shutil.which("hetero", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "hetero_core"]


def timed_run(extra: list[str]) -> float:
    command = hetero_command() + ["run", "--max-tokens", "1", "--temperature", "0", *extra, PROMPT]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"hetero run failed ({done.returncode}):\n{done.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", default=None)
    parser.add_argument("extra", nargs="*", help="extra flags for hetero run (after --)")
    args = parser.parse_args()
    timed_run(args.extra)  # converts on first use; warms the page cache
    times = [timed_run(args.extra) for _ in range(args.runs)]
    median = statistics.median(times)
    print(f"python {platform.python_version()}, {len(os.sched_getaffinity(0))} CPUs allowed, "
          f"load average {os.getloadavg()[0]:.2f}")
    print("runs (s): " + ", ".join(f"{t:.2f}" for t in times))
    print(f"warm start to first token (process start to exit, --max-tokens 1): median {median:.2f} s, "
          f"min {min(times):.2f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs_s": times, "median_s": median, "load_average": os.getloadavg()}, f, indent=2)


if __name__ == "__main__":
    main()
