"""Does this CPU multiply faster in bf16 than in fp32? Measured once, remembered.

A native-bf16 flag is not enough to choose bf16: on a 2-core AMD Zen 5 VM a bf16 matmul ran at
~4x the fp32 rate (1,016 against 239 GFLOP/s), on a 2-core Intel Emerald Rapids VM whose
hypervisor hides AMX at about half of it (170 against 323 GFLOP/s). So ``dtype = "auto"`` times
one matmul of each dtype (torch's oneDNN path, ~20-50 ms) the first time it runs on a CPU and keeps
the ratio in ``<cache_dir>/cpu_dtype_speed.json``, keyed by the CPU's model name and flags and the
torch version; later starts read it. The file carries a checksum (``cache_file``); a damaged one,
or a ratio that is not a positive finite number, is measured again with one warning.
"""

from __future__ import annotations

import hashlib
import math
import time
from pathlib import Path

import torch

from hetero_core.cache import cache_file
from hetero_core.cache.cache_dir import default_cache_dir
from hetero_core.logging import get_logger
from hetero_core.model.cpu.cpu_info import cpu_flags, cpu_model_name

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
    if key in known and _is_speedup(known[key]):
        return float(known[key])
    if key in known:
        cache_file.warn_rebuilding(
            cache_file.CacheFileInvalid(
                path, f"this CPU's speed-up is {known[key]!r}, not a positive finite number"
            )
        )
    speedup = measure_bf16_speedup()
    log.info("executor.cpu_bf16_speed_measured", bf16_speedup=round(speedup, 2), cache=str(path))
    if _is_speedup(speedup):
        _write(path, {**{k: v for k, v in known.items() if _is_speedup(v)}, key: speedup})
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


def _is_speedup(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def _read(path: Path) -> dict:
    """The cached speed-ups by CPU key; {} when there are none or the file is damaged (one warning)."""
    return cache_file.read_json_object(path)


def _write(path: Path, data: dict) -> None:
    cache_file.write_json_object(path, data, "executor.cpu_bf16_speed_not_cached")
