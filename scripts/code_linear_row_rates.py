#!/usr/bin/env python3
"""Rates of the block-code linears by rows per call: how decode (1-32 rows) and prefill (128+ rows)
steps run on this CPU's kernel path (``q8a_coded_linear`` with int8 activations, ``coded_linear`` with
fp32 ones), in GMAC/s, for each compact code layout (``code_panels``), on one weight that stays in the
cache (compute, not the memory read, is what batched rows cost) and, at one row, beside the read rate.

    .venv/bin/python scripts/code_linear_row_rates.py [--threads 2] [--rows 1,4,32,128] [--shape 2048x2048]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.model.test_code_panels' codes

from hetero_core.model.cpu.code_panels import (  # noqa: E402
    CODES_Q4_F16,
    CODES_Q4_SUPER,
    CODES_Q8_F16,
    CODES_Q8_SUB16_SUPER,
    pack_codes,
)
from hetero_core.model.cpu.kernels import load_cpu_kernels  # noqa: E402
from tests.model.test_code_panels import random_codes  # noqa: E402

NAMES = {CODES_Q4_F16: "Q4_0/Q4_1 f16", CODES_Q4_SUPER: "Q4_K", CODES_Q8_F16: "Q8_0 f16"}
NAMES[CODES_Q8_SUB16_SUPER] = "Q6_K"


def best_seconds(call, budget_s: float = 0.4) -> float:
    """The fastest of repeated calls (after one warm-up), repeated for about ``budget_s``."""
    call()
    best, spent = float("inf"), 0.0
    while spent < budget_s:
        start = time.perf_counter()
        call()
        elapsed = time.perf_counter() - start
        best, spent = min(best, elapsed), spent + elapsed
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,2,4,8,32,128")
    parser.add_argument("--shape", default="2048x2048", help="outputs x inputs (inputs a multiple of 256)")
    parser.add_argument("--float", action="store_true", help="coded_linear (fp32 activations) too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    outputs, inputs = (int(v) for v in args.shape.split("x"))
    kernels = load_cpu_kernels(required=True)
    paths = {"q8a_coded_linear": dataclasses.replace(kernels, code_activations="int8")}
    if args.float:
        paths["coded_linear"] = dataclasses.replace(kernels, code_activations="float")
    rows = [int(r) for r in args.rows.split(",")]
    print(f"{args.threads} threads, [{outputs}, {inputs}], q8a path {kernels.q8a_path}; GMAC/s by rows")
    print(f"{'codes':14s} {'kernel':17s} " + " ".join(f"{r:>7d}" for r in rows))
    for layout, name in NAMES.items():
        d, m, q, supers = random_codes(layout, outputs, inputs)
        weight = pack_codes(d, m, q, supers)
        for linear, kern in paths.items():
            call = getattr(kern, linear)
            rates = []
            for count in rows:
                x = torch.randn(count, inputs)
                seconds = best_seconds(lambda: call(x, weight, None))
                rates.append(count * outputs * inputs / seconds / 1e9)
            print(f"{name:14s} {linear:17s} " + " ".join(f"{r:7.1f}" for r in rates))


if __name__ == "__main__":
    main()
