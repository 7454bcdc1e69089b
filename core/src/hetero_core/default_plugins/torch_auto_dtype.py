"""``dtype = "auto"`` for the torch executor on the CPU: the candidates this CPU offers, each loaded as
the executor runs it and timed on the model's own steps (``model/cpu/dtype_choice.py`` decides and
remembers, ``model/cpu/dtype_probe.py`` times).

Candidates: ``float32`` everywhere; ``bfloat16`` where the CPU computes bf16 natively (avx512_bf16 or
amx_bf16, and torch's oneDNN takes it); ``bfloat16-amx`` beside it where the kernels' AMX variant
passes its gate (``model/cpu/amx.py``; option ``amx_linears``), ``bfloat16`` then being the AVX-512
one. With one candidate nothing is timed. The first start of a model on a CPU loads each candidate
once (its prepared-weights file is written, as it would be for a start in that dtype; the losers'
new files are deleted, never the winner's: the two bf16 candidates share theirs) and runs
``dtype_probe``'s steps on it; later starts read the record.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import hashlib

import torch

import hetero_core
from hetero_core.logging import get_logger
from hetero_core.model.cpu import compute_dtype, dtype_choice, dtype_probe
from hetero_core.model.cpu.amx import amx_kernels
from hetero_core.model.cpu.cpu_info import cpu_flags, cpu_model_name
from hetero_core.model.cpu.prepared_weights import checkpoint_identity, prepared_path

log = get_logger("hetero.executor")


def auto_candidates(kernels, amx: bool = True) -> dict[str, tuple[torch.dtype, object]]:
    """Candidate name -> (dtype, the kernels it runs on) on this CPU; ``amx``: the AMX variant may be one."""
    candidates = {"float32": (torch.float32, kernels)}
    if compute_dtype.cpu_has_native_bf16():
        candidates["bfloat16"] = (torch.bfloat16, kernels)
        variant = amx_kernels(kernels) if amx and kernels is not None else None
        if variant is not None:
            candidates["bfloat16-amx"] = (torch.bfloat16, variant)
    return candidates


def choose_auto_dtype(model_dir, options, kernels, build, cache_dir) -> tuple[torch.dtype, object, str]:
    """(dtype, kernels, reason) for ``dtype = "auto"``: ``build(dtype, kernels, num_blocks, block_size)``
    makes a runner of a candidate to time."""
    candidates = auto_candidates(kernels, options.amx_linears)
    new_files = {}  # candidate -> the prepared file its probe wrote (None: it was there before, or none)

    def measure(name: str) -> dtype_choice.StepTimes:
        dtype, variant = candidates[name]
        path = prepared_path(model_dir, cache_dir, dtype, variant)
        existed = path.exists()
        runner = build(dtype, variant, dtype_probe.num_blocks(), dtype_probe.BLOCK_SIZE)
        new_files[name] = None if existed else path
        try:
            return dtype_probe.time_steps(runner)
        finally:
            runner.shutdown()
            del runner
            gc.collect()  # this candidate's weights go before the next one loads

    key = dtype_choice.cache_key(
        _cpu(), _versions(options, kernels), torch.get_num_threads(), checkpoint_identity(model_dir)
    )
    choice = dtype_choice.choose(list(candidates), measure, key, cache_dir)
    if new_files:  # candidates were loaded and freed
        release_freed_memory()
    dtype, chosen_kernels = candidates[choice.name]
    kept = prepared_path(model_dir, cache_dir, dtype, chosen_kernels)
    for name, path in new_files.items():
        if name != choice.name and path is not None and path != kept:
            path.unlink(missing_ok=True)
    return dtype, chosen_kernels, choice.reason


def release_freed_memory() -> bool:
    """Hand the heap's free pages back to the OS (glibc's ``malloc_trim``); True where it ran. The
    probe's candidates, loaded and freed, leave their memory in glibc's heap (its mmap threshold rises
    after the first large free): 1.4 GB of resident memory for the 360M shape's fp32 candidate."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim this way
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def _cpu() -> str:
    flags = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:12]
    return f"{cpu_model_name()} | flags {flags}"


def _versions(options, kernels) -> str:
    """What else changes the steps' speed: the versions, the kernels' build, the options."""
    library = kernels.path.name if kernels is not None else "no kernels"
    settings = (
        options.prepack_weights,
        options.fused_decode,
        options.block_code_weights,
        options.code_activations,
        options.cpu_kernels,
    )
    return f"torch {torch.__version__} | hetero {hetero_core.__version__} | {library} | options {settings}"
