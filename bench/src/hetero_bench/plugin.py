"""The ``hetero bench`` command, added to ``hetero`` through core's ``register_commands`` hook.

Light on purpose: discovery imports this module in every ``hetero`` process (argparse only); the
command's own module, and every benchmark's, load when ``hetero bench`` runs.
"""

from __future__ import annotations

import argparse

from hetero_core import hookimpl


@hookimpl
def register_commands(commands):
    bench = commands.add_parser(
        "bench",
        help="run a benchmark: a table, --json FILE, --plot FILE.png (no name: list them)",
        description="Run one of Hetero's benchmarks; with no name, list them. "
        "`hetero bench NAME --help` shows a benchmark's options.",
    )
    bench.add_argument("name", nargs="?", help="the benchmark (see the list: `hetero bench`)")
    bench.add_argument("options", nargs=argparse.REMAINDER, help="the benchmark's options")
    # hetero's parser class (a misspelt flag gets the closest one): each benchmark's parser builds on it
    bench.set_defaults(handler=bench_command, parser_class=type(bench))


def bench_command(args: argparse.Namespace) -> int:
    from hetero_bench.command import bench_command

    return bench_command(args)
