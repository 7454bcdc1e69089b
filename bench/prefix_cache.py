"""`hetero bench prefix-cache`, kept under its old path: the benchmark lives in hetero_core/benchmarks/.

    .venv/bin/python bench/prefix_cache.py [options]      # the same as: .venv/bin/hetero bench prefix-cache [options]
    .venv/bin/hetero bench prefix-cache --help            # its options
"""

import sys

from hetero_core.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "prefix-cache", *sys.argv[1:]]))
