"""`hetero bench warm-start`, kept under its old path: the benchmark lives in hetero_core/benchmarks/.

    .venv/bin/python bench/warm_start.py [options]      # the same as: .venv/bin/hetero bench warm-start [options]
    .venv/bin/hetero bench warm-start --help            # its options
"""

import sys

from hetero_core.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "warm-start", *sys.argv[1:]]))
