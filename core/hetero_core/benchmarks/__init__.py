"""``hetero bench``: the project's benchmarks, one module each, found by name.

A benchmark module defines ``SUMMARY`` (one line), ``NEEDS`` (what it needs to run, one phrase),
``add_arguments(parser)`` and ``run(args) -> Report`` (``report.py``). It imports light at the top
(no torch, no transformers): ``hetero bench`` imports every module to list them.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from hetero_core.errors import HeteroError
from hetero_core.suggest import did_you_mean

# name -> module, in the order `hetero bench` lists them
BENCHMARKS = {
    "offline": "hetero_core.benchmarks.offline",
    "serving": "hetero_core.benchmarks.serving",
    "replicas": "hetero_core.benchmarks.replicas",
    "prefix-cache": "hetero_core.benchmarks.prefix_cache",
    "kv-allocators": "hetero_core.benchmarks.kv_allocators",
    "chunked-prefill": "hetero_core.benchmarks.chunked_prefill",
    "scheduler-overhead": "hetero_core.benchmarks.scheduler_overhead",
    "warm-start": "hetero_core.benchmarks.warm_start",
    "triton-decode": "hetero_core.benchmarks.triton_decode",
}


def load_benchmark(name: str) -> ModuleType:
    """The module of benchmark ``name``; an unknown name is an error listing the others."""
    if name not in BENCHMARKS:
        raise HeteroError(f"unknown benchmark {name!r}; available: {', '.join(BENCHMARKS)}"
                          f"{did_you_mean(name, BENCHMARKS)}")
    return importlib.import_module(BENCHMARKS[name])
