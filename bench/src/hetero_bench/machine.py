"""The machine a benchmark ran on, for its JSON: CPU model and flags, cores, versions, GPU."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform

# The CPU features that decide which kernels torch and oneDNN can use.
CPU_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


def cpu_model_and_flags(path: str = "/proc/cpuinfo") -> tuple[str, list[str]]:
    """The CPU's model name and which of ``CPU_FLAGS`` it has (from /proc/cpuinfo; Linux only)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return model, [flag for flag in CPU_FLAGS if flag in flags]


def machine_info() -> dict:
    cpu, flags = cpu_model_and_flags()
    info = {
        "cpu": cpu,
        "arch": platform.machine(),
        "cpu_flags": flags,
        "num_cpus": os.cpu_count(),
        "num_cpus_allowed": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "hetero_core": _version("hetero-core"),
        "hetero_bench": _version("hetero-bench"),
        "torch": None,
        "gpu": None,
    }
    if importlib.util.find_spec("torch") is not None:
        import torch

        info["torch"] = torch.__version__
        info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    for name in ("transformers", "triton"):
        if importlib.util.find_spec(name) is not None:
            info[name] = _version(name)
    return info


def describe(info: dict) -> str:
    """One line for the top of a benchmark's output."""
    threads = f", {info['torch_threads']} torch threads" if info.get("torch_threads") else ""
    torch = f", torch {info['torch']}" if info["torch"] else ", no torch"
    gpu = f", GPU {info['gpu']}" if info["gpu"] else ""
    flags = f" ({' '.join(info['cpu_flags'])})" if info["cpu_flags"] else ""
    return (
        f"machine: {info['cpu']}{flags}, {info['num_cpus_allowed']} CPUs{threads}{gpu}, "
        f"python {info['python']}{torch}"
    )


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
