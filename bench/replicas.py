"""`hetero bench replicas`: the benchmark lives in hetero_core/benchmarks/replicas.py.

    .venv/bin/python bench/replicas.py [options]      # the same as: .venv/bin/hetero bench replicas [options]
    .venv/bin/hetero bench replicas --help            # its options
"""

import sys

from hetero_core.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "replicas", *sys.argv[1:]]))
