#!/usr/bin/env python3
"""Two builds of the CPU kernels side by side in one process, their calls alternated: a kernel change's
speed measured against the build before it on a shared, noisy machine (where two runs of one command
can differ by more than the change), with a check that both give the same bits.

Build each library first (``load_cpu_kernels`` from each checkout; the files are in the cache's
``kernels/`` folder, named by their sources' hash), then:

    .venv/bin/python scripts/kernel_library_ab.py OLD.so NEW.so --linear coded_linear --rows 1,2,32
    .venv/bin/python scripts/kernel_library_ab.py OLD.so NEW.so --linear bf16_linear --rows 32,128,512

Prints GMAC/s of each (the median of ``--rounds`` alternations) and NEW / OLD.
"""

from __future__ import annotations

import argparse
import ctypes
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
    pack_codes,
)
from hetero_core.model.cpu.kernels import CpuKernels, kernel_signatures  # noqa: E402
from tests.model.test_code_panels import random_codes  # noqa: E402

CODES = {CODES_Q4_F16: "Q4_1", CODES_Q4_SUPER: "Q4_K", CODES_Q8_F16: "Q8_0", CODES_Q8_SUB16_SUPER: "Q6_K"}
BF16_SHAPES = ((2048, 2048, False), (16384, 2048, True), (2048, 8192, False))  # (N, K, swiglu)


def library(path: str) -> CpuKernels:
    handle = ctypes.CDLL(path)
    for name, argtypes in kernel_signatures().items():
        function = getattr(handle, name)
        function.argtypes, function.restype = argtypes, ctypes.c_int
    return CpuKernels(handle, Path(path), handle.swiglu_pair_columns())


def alternated(calls: dict[str, object], rounds: int) -> dict[str, float]:
    """The median seconds of each call, the calls alternated ``rounds`` times after one warm-up each."""
    for call in calls.values():
        call()
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def report(label: str, macs: int, seconds: dict[str, float], same: bool) -> None:
    old, new = (macs / seconds[k] / 1e9 for k in ("old", "new"))
    print(
        f"{label}: old {old:6.1f} new {new:6.1f} GMAC/s  new/old {new / old:.2f}x  same bits {same}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument(
        "--linear", choices=("coded_linear", "q8a_coded_linear", "bf16_linear"), default="coded_linear"
    )
    parser.add_argument("--rows", default="1,2,32")
    parser.add_argument(
        "--shape", default="2048x2048", help="codes: outputs x inputs (inputs a multiple of 256)"
    )
    parser.add_argument("--copies", type=int, default=8, help="codes: weights per timed call (past the L2)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    old, new = library(args.old), library(args.new)
    if args.linear == "bf16_linear":
        for n, k, swiglu in BF16_SHAPES:
            weight = (torch.randn(n, k) * 0.02).bfloat16()
            packed = old.pack_bf16_linear(weight, swiglu=swiglu)
            for count in rows:
                x = torch.randn(count, k).bfloat16()
                kernels = {"old": old, "new": new}
                calls = {
                    name: (lambda kk=kk: kk.bf16_linear(x, packed, None, swiglu=swiglu))
                    for name, kk in kernels.items()
                }
                same = torch.equal(calls["old"](), calls["new"]())
                report(
                    f"[{n}, {k}] swiglu={swiglu} rows {count:4d}",
                    count * n * k,
                    alternated(calls, args.rounds),
                    same,
                )
        return
    activations = "int8" if args.linear == "q8a_coded_linear" else "float"
    old, new = (dataclasses.replace(kk, code_activations=activations) for kk in (old, new))
    outputs, inputs = (int(v) for v in args.shape.split("x"))
    for layout, name in CODES.items():
        d, m, q, supers = random_codes(layout, outputs, inputs)
        weights = [pack_codes(d, m, q, supers) for _ in range(args.copies)]
        for count in rows:
            x = torch.randn(count, inputs)

            def run(kk, x=x):
                for w in weights:
                    getattr(kk, args.linear)(x, w, None)

            same = torch.equal(
                getattr(old, args.linear)(x, weights[0], None), getattr(new, args.linear)(x, weights[0], None)
            )
            seconds = alternated({"old": lambda: run(old), "new": lambda: run(new)}, args.rounds)
            report(f"{name} rows {count:3d}", count * outputs * inputs * args.copies, seconds, same)


if __name__ == "__main__":
    main()
