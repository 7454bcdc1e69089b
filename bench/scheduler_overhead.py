"""`hetero bench scheduler-overhead`, kept under its old path: the benchmark lives in hetero_core/benchmarks/.

    .venv/bin/python bench/scheduler_overhead.py [options]      # the same as: .venv/bin/hetero bench scheduler-overhead [options]
    .venv/bin/hetero bench scheduler-overhead --help            # its options
"""

import sys

from hetero_core.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "scheduler-overhead", *sys.argv[1:]]))
