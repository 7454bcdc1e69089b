"""The executor's compute dtype: an explicit name, or ``"auto"``.

``"auto"`` picks what the hardware computes fastest without changing the answer in a way users
notice: bfloat16 on a CPU with native bf16 instructions (AVX-512 BF16 or AMX) where a bf16 matmul
is measurably faster than fp32 (``cpu_bf16_speed``: ~4x on an AMD Zen 5, and the weights stream at
half the bytes; but about half the fp32 rate on an Intel Xeon without AMX), float32 on every other
CPU (bf16 would be emulated there, slower than fp32), bfloat16 on a CUDA device that supports it
(float16 otherwise). An explicit name always wins.

The torch executor's ``auto`` on the CPU (one process) no longer asks the matmul: it times the model
itself in each candidate (``default_plugins/torch_auto_dtype.py``, ``dtype_choice``); this rule
remains for tensor-parallel ranks and CUDA devices, and ``cpu_has_native_bf16`` says which CPUs
have a bf16 candidate at all.
"""

from __future__ import annotations

import torch

from hetero_core.model.cpu.bf16_speed import bf16_is_faster
from hetero_core.model.cpu.cpu_info import NATIVE_BF16_CPU_FLAGS, cpu_flags

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``"auto"`` or a name of ``DTYPES`` -> the torch dtype the executor runs in on ``device``."""
    if name != "auto":
        return DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu" and cpu_prefers_bf16():
        return torch.bfloat16
    return torch.float32


def cpu_prefers_bf16() -> bool:
    """True when this CPU computes bf16 natively and faster than fp32 (measured once, cached)."""
    if not cpu_has_native_bf16():
        return False
    return bf16_is_faster()


def cpu_has_native_bf16() -> bool:
    """True when this CPU computes bf16 natively and torch's oneDNN can use it."""
    if not native_bf16_flags(cpu_flags()):
        return False
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def native_bf16_flags(flags: frozenset[str]) -> list[str]:
    """The native-bf16 instruction sets among ``flags`` (``/proc/cpuinfo`` names), in a fixed order."""
    return [flag for flag in NATIVE_BF16_CPU_FLAGS if flag in flags]
