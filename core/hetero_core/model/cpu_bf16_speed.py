"""Does this CPU multiply faster in bf16 than in fp32? Measured once, remembered.

A native-bf16 flag is not enough to choose bf16: on a 2-core AMD Zen 5 VM a bf16 matmul ran at
~4x the fp32 rate (1,016 against 239 GFLOP/s), on a 2-core Intel Emerald Rapids VM whose
hypervisor hides AMX at about half of it (170 against 323 GFLOP/s). So ``dtype = "auto"`` times
one matmul of each dtype (torch's oneDNN path, ~20-50 ms) the first time it runs on a CPU and keeps
the ratio in ``<cache_dir>/cpu_dtype_speed.json``, keyed by the CPU's model name and flags and the
torch version; later starts read it.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch

from hetero_core.logging import get_logger
from hetero_core.model.atomic_file import replaced_atomically
from hetero_core.model.compute_dtype import cpu_flags, cpu_model_name
from hetero_core.model.gguf_cache import default_cache_dir

log = get_logger("hetero.executor")

CACHE_FILE = "cpu_dtype_speed.json"
MIN_BF16_SPEEDUP = 1.2  # bf16 rounds activations and weights: worth it only for a clear gain
SHAPE = (128, 1024, 1024)  # rows, in, out: a decode-to-prefill-sized linear, ~0.27 GFLOP
REPEATS = 5


def bf16_speedup(cache_dir: Path | None = None) -> float:
    """fp32 matmul time / bf16 matmul time on this CPU (> 1: bf16 is faster), from the cache or
    measured now and cached."""
    path = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / CACHE_FILE
    key = _cpu_key()
    known = _read(path)
    if isinstance(known.get(key), (int, float)):
        return float(known[key])
    speedup = measure_bf16_speedup()
    log.info("executor.cpu_bf16_speed_measured", bf16_speedup=round(speedup, 2), cache=str(path))
    _write(path, {**known, key: speedup})
    return speedup


def bf16_is_faster(cache_dir: Path | None = None) -> bool:
    return bf16_speedup(cache_dir) >= MIN_BF16_SPEEDUP


def measure_bf16_speedup() -> float:
    rows, in_features, out_features = SHAPE
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, in_features, generator=generator)
    weight = torch.randn(out_features, in_features, generator=generator)
    fp32 = _best_time(x, weight)
    bf16 = _best_time(x.bfloat16(), weight.bfloat16())
    return fp32 / bf16


def _best_time(x: torch.Tensor, weight: torch.Tensor) -> float:
    torch.nn.functional.linear(x, weight)  # oneDNN builds its kernel on the first call
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        torch.nn.functional.linear(x, weight)
        best = min(best, time.perf_counter() - start)
    return best


def _cpu_key() -> str:
    flags = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:12]
    return f"{cpu_model_name()} | flags {flags} | torch {torch.__version__}"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, data: dict) -> None:
    """``data`` to ``path`` atomically; a failure (a read-only cache) costs only a measurement at the
    next start, and leaves no temporary file behind."""
    try:
        with replaced_atomically(path, ".json") as tmp:
            Path(tmp).write_text(json.dumps(data, indent=1, sort_keys=True))
    except OSError as exc:
        log.info("executor.cpu_bf16_speed_not_cached", reason=str(exc))
