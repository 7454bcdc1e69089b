"""`hetero bench triton-decode`, kept under its old path: the benchmark lives in hetero_core/benchmarks/.

    .venv/bin/python bench/triton_decode_kernel.py [options]      # the same as: .venv/bin/hetero bench triton-decode [options]
    .venv/bin/hetero bench triton-decode --help            # its options
"""

import sys

from hetero_core.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "triton-decode", *sys.argv[1:]]))
