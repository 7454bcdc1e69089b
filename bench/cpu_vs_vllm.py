"""Hetero against vLLM's CPU backend (and HF generate) on the CPU-speed workload, in one run.

`hetero bench offline` with the vLLM peers in both dtypes, compiled (vLLM's best configuration),
alternating rounds, the GEMM ceiling and achieved GFLOP/s, batch-1 decode latency and load to first
token. vLLM runs from its own venv (`.venv-vllm`; see hetero_core/benchmarks/vllm_peer.py for the
set-up); without it the vLLM peers are skipped with one line each.

    .venv/bin/python bench/cpu_vs_vllm.py [hetero bench offline options, e.g. --rounds 5 --json out.json]
    # the same as: .venv/bin/hetero bench offline --peers hf,vllm-fp32,vllm-bf16 --rounds 3 \\
    #                  --first-token-runs 3 [options]
"""

import sys

from hetero_core.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "offline", "--peers", "hf,vllm-fp32,vllm-bf16", "--rounds", "3",
                   "--first-token-runs", "3", *sys.argv[1:]]))
