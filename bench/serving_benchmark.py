"""`hetero bench serving`, kept under its old path: the benchmark lives in hetero_core/benchmarks/.

    .venv/bin/python bench/serving_benchmark.py [options]      # the same as: .venv/bin/hetero bench serving [options]
    .venv/bin/hetero bench serving --help            # its options
"""

import sys

from hetero_core.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "serving", *sys.argv[1:]]))
