"""`hetero bench kv-allocators`, kept under its old path: the benchmark lives in hetero_core/benchmarks/.

    .venv/bin/python bench/kv_allocators.py [options]      # the same as: .venv/bin/hetero bench kv-allocators [options]
    .venv/bin/hetero bench kv-allocators --help            # its options
"""

import sys

from hetero_core.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "kv-allocators", *sys.argv[1:]]))
