#!/usr/bin/env python3
"""One-row rates of the block-code linears in each code layout (``code_panels``), weights streamed from
memory: the measurement behind ``gguf_code_linears.super_block_scales`` (docs/benchmarks.md).

For each kind of codes, one random weight [8192, 2048] packed in its fp32-scale layout and in its
compact one(s); ``--copies`` clones of each (so that a pass reads from DRAM, not the L3), every clone
run once per round through ``q8a_coded_linear`` (int8 activations) and ``coded_linear`` (fp32), one
row. Prints GMAC/s and the bytes read per second, and the compact layout's rate over the fp32-scale
one's. The same codes give the same bits in every layout (tests/model/test_code_panels.py).

    .venv/bin/python scripts/code_layout_rates.py [--threads 2] [--copies 24] [--rounds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
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
    code_format,
    pack_codes,
)
from hetero_core.model.cpu.kernels import load_cpu_kernels  # noqa: E402
from tests.model.test_code_panels import random_codes  # noqa: E402

NAMES = {CODES_Q4_F16: "Q4_0/Q4_1 f16", CODES_Q4_SUPER: "Q4_K super", CODES_Q8_F16: "Q8_0 f16"}
NAMES[CODES_Q8_SUB16_SUPER] = "Q6_K super"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--copies", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kernels = load_cpu_kernels(required=True)
    paths = {
        "q8a_coded_linear": dataclasses.replace(kernels, code_activations="int8"),
        "coded_linear": dataclasses.replace(kernels, code_activations="float"),
    }
    outputs, inputs = 8192, 2048
    x = torch.randn(1, inputs)
    print(f"{args.threads} threads, {args.copies} copies of [{outputs}, {inputs}], median of {args.rounds}")
    for layout, name in NAMES.items():
        d, m, q, supers = random_codes(layout, outputs, inputs)
        packed = {
            "compact": pack_codes(d, m, q, supers),
            "fp32 scales": pack_codes(d, m, q, supers, compact=False),
        }
        assert code_format(packed["compact"]) == layout
        for linear, kern in paths.items():
            rates = {}
            for label, weight in packed.items():
                copies = [weight.clone() for _ in range(args.copies)]
                call = getattr(kern, linear)
                call(x, copies[0], None)
                times = []
                for _ in range(args.rounds):
                    start = time.perf_counter()
                    for w in copies:
                        call(x, w, None)
                    times.append(time.perf_counter() - start)
                seconds = statistics.median(times)
                rates[label] = outputs * inputs * args.copies / seconds / 1e9
                gbs = weight.numel() * args.copies / seconds / 1e9
                print(
                    f"{name:14s} {linear:17s} {label:12s} {weight.numel() / outputs / inputs:.3f} B/weight "
                    f"{rates[label]:6.1f} GMAC/s {gbs:5.1f} GB/s"
                )
                del copies
            ratio = rates["compact"] / rates["fp32 scales"]
            print(f"{name:14s} {linear:17s} compact / fp32 scales: {ratio:.2f}x")


if __name__ == "__main__":
    main()
