"""``python -m hetero_bench NAME [options]``: ``hetero bench`` without installed entry points (a
checkout on PYTHONPATH, as scripts/gpu_check.sh runs it on a machine with nothing installed)."""

from __future__ import annotations

import argparse
import sys

from hetero_core import HeteroError
from hetero_core.logging import configure_logging

from hetero_bench.command import bench_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetero_bench", description="Run one of Hetero's benchmarks.")
    parser.add_argument("name", nargs="?", help="the benchmark (no name: list them)")
    parser.add_argument("options", nargs=argparse.REMAINDER, help="the benchmark's options")
    args = parser.parse_args(argv)
    configure_logging(level="warning")
    try:
        return bench_command(args)
    except HeteroError as exc:
        print(f"hetero bench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
