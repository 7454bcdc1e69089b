"""``hetero bench``: list the benchmarks, or run one (a table on stdout, ``--json``, ``--plot``).

Each benchmark's options belong to its own parser (``hetero bench NAME --help``), built only when
that benchmark runs, of the class of ``hetero``'s own (a misspelt flag gets the closest one); its
mistakes are one line and exit 2 (a ``HeteroError``), like every other ``hetero`` mistake. Logging
is configured by ``hetero`` before this runs.
"""

from __future__ import annotations

import argparse
import os
import sys

from hetero_bench.catalog import BENCHMARKS, load_benchmark
from hetero_core import HeteroError


def bench_command(args: argparse.Namespace) -> int:
    if args.name is None:
        width = max(map(len, BENCHMARKS))
        for name in BENCHMARKS:
            module = load_benchmark(name)
            print(f"{name:<{width}}  {module.SUMMARY}\n{'':<{width}}  needs: {module.NEEDS}")
        print(
            "\nrun one: hetero bench NAME [options] [--json FILE] [--plot FILE.png]; "
            "options: hetero bench NAME --help"
        )
        return 0
    module = load_benchmark(args.name)
    base = getattr(args, "parser_class", argparse.ArgumentParser)
    options = parse_options(args.name, module, args.options, base)
    return run_benchmark(args.name, module, options)


def parse_options(name: str, module, argv: list[str], base: type[argparse.ArgumentParser]):
    """The benchmark's options; ``base``: the class of hetero's parsers (``hetero bench``'s), which
    the benchmark's parser builds on."""
    from hetero_bench.options import bench_parser_class

    epilog = module.epilog() if hasattr(module, "epilog") else None
    parser = bench_parser_class(base)(
        prog=f"hetero bench {name}",
        description=module.__doc__,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    module.add_arguments(parser)
    output = parser.add_argument_group("output")
    output.add_argument("--json", metavar="FILE", help="also write the results, machine and settings as JSON")
    output.add_argument("--plot", metavar="FILE.png", help="also draw the results (needs matplotlib)")
    options = parser.parse_args(argv)
    _check_outputs(options)
    return options


def run_benchmark(name: str, module, options: argparse.Namespace) -> int:
    from hetero_bench.machine import describe, machine_info
    from hetero_bench.report import print_report, write_json, write_plot

    report = module.run(options)
    machine = machine_info()
    print(describe(machine))
    print_report(report, sys.stdout)
    if options.json:
        write_json(report, options.json, machine)
        print(f"hetero bench: wrote {options.json}", file=sys.stderr)
    if options.plot:
        write_plot(report, options.plot, subtitle=describe(machine).removeprefix("machine: "))
        print(f"hetero bench: wrote {options.plot}", file=sys.stderr)
    return 0


def _check_outputs(options: argparse.Namespace) -> None:
    """Output mistakes show before a benchmark spends minutes running."""
    from hetero_bench.report import check_plot_available

    if options.plot:
        if not options.plot.lower().endswith(".png"):
            raise HeteroError(f"--plot {options.plot}: the plot is a PNG; give a FILE.png")
        check_plot_available()
    for flag, path in (("--json", options.json), ("--plot", options.plot)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise HeteroError(f"{flag} {path}: no such directory {os.path.dirname(os.path.abspath(path))}")
