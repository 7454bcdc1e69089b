"""`hetero bench offline` with this script's historical defaults: peers HF static batch and HF sequential,
one round. The benchmark lives in hetero_core/benchmarks/offline.py.

    .venv/bin/python bench/offline_throughput.py [--skip-sequential] [hetero bench offline options]
    # the same as: .venv/bin/hetero bench offline --peers hf,hf-sequential --rounds 1 [options]
"""

import sys

from hetero_core.cli.main import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    peers = "hf" if "--skip-sequential" in argv else "hf,hf-sequential"
    argv = [a for a in argv if a != "--skip-sequential"]
    sys.exit(main(["bench", "offline", "--peers", peers, "--rounds", "1", *argv]))
