"""The benchmarks of ``hetero bench``, one module each, found by name.

A benchmark module defines ``SUMMARY`` (one line), ``NEEDS`` (what it needs to run, one phrase),
``add_arguments(parser)`` and ``run(args) -> Report`` (``report.py``); optionally ``epilog()`` for
its ``--help``. It imports light at the top (no torch, no transformers): ``hetero bench`` imports
every module to list them. A new benchmark is one module in ``benchmarks/`` and one line here.
"""

from __future__ import annotations

import difflib
import importlib
from types import ModuleType

from hetero_core import HeteroError

# name -> module, in the order `hetero bench` lists them
BENCHMARKS = {
    "offline": "hetero_bench.benchmarks.offline",
    "serving": "hetero_bench.benchmarks.serving",
    "replicas": "hetero_bench.benchmarks.replicas",
    "prefix-cache": "hetero_bench.benchmarks.prefix_cache",
    "parallel-sampling": "hetero_bench.benchmarks.parallel_sampling",
    "kv-allocators": "hetero_bench.benchmarks.kv_allocators",
    "chunked-prefill": "hetero_bench.benchmarks.chunked_prefill",
    "scheduler-overhead": "hetero_bench.benchmarks.scheduler_overhead",
    "host-overhead": "hetero_bench.benchmarks.host_overhead",
    "warm-start": "hetero_bench.benchmarks.warm_start",
    "busy-cpu": "hetero_bench.benchmarks.busy_cpu",
    "tensor-parallel": "hetero_bench.benchmarks.tensor_parallel",
    "pipeline-parallel": "hetero_bench.benchmarks.pipeline_parallel",
    "gpu-offline": "hetero_bench.benchmarks.gpu_offline",
    "triton-decode": "hetero_bench.benchmarks.triton_decode",
    "structured-output": "hetero_bench.benchmarks.structured_output",
    "models": "hetero_bench.benchmarks.models",
    "moe": "hetero_bench.benchmarks.moe",
    "disaggregated": "hetero_bench.benchmarks.disaggregated",
    "spec-decode": "hetero_bench.benchmarks.spec_decode",
    "quantization": "hetero_bench.benchmarks.quantization",
    "gguf": "hetero_bench.benchmarks.gguf",
    "lm-eval": "hetero_bench.benchmarks.lm_eval",
    "memory": "hetero_bench.benchmarks.memory",
}


def load_benchmark(name: str) -> ModuleType:
    """The module of benchmark ``name``; an unknown name is an error listing the others."""
    if name not in BENCHMARKS:
        close = difflib.get_close_matches(name, list(BENCHMARKS), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise HeteroError(f"unknown benchmark {name!r}; available: {', '.join(BENCHMARKS)}{hint}")
    return importlib.import_module(BENCHMARKS[name])
