"""`hetero bench chunked-prefill`, kept under its old path: the benchmark lives in hetero_core/benchmarks/.

    .venv/bin/python bench/chunked_prefill_latency.py [options]      # the same as: .venv/bin/hetero bench chunked-prefill [options]
    .venv/bin/hetero bench chunked-prefill --help            # its options
"""

import sys

from hetero_core.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "chunked-prefill", *sys.argv[1:]]))
