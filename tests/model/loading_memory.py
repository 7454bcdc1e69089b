"""Peak resident memory of one model load, measured in a fresh process (``test_loading_memory``).

Run as ``python -m tests.model.loading_memory CASE.json``; prints one JSON line: ``baseline`` (the
process's resident bytes with torch, the model code and the CPU kernels loaded, before the load),
``peak`` (the most it held during the load: ``VmHWM``, reset to the baseline through
``/proc/self/clear_refs`` first; for a GGUF the ``gguf`` package and its dequantization are imported
before it), and ``weights`` (the bytes of the loaded model's tensors: each storage once, a packed
linear's weight counted as it runs). Case keys: ``model_dir``, ``dtype``, ``path`` (``load_model``,
``packed`` for ``load_packed_model``, ``shard`` for tensor-parallel rank 0 of 2, ``int8`` / ``w8a8``
for ``load_packed_model`` quantizing as it loads), ``cache_dir`` (``packed``, ``int8``, ``w8a8``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

QUANTIZED = ("int8", "w8a8")


def status_bytes(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE).group(1)) * 1024


def reset_peak() -> bool:
    """Make ``VmHWM`` the current resident size (Linux 4.0+); False where the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def weight_bytes(model) -> int:
    """Bytes of the model's tensors as it runs them: parameters, buffers and packed weights, each
    storage once (a view of a mapped prepared file counts its slice)."""
    import torch

    seen, total = set(), 0
    tensors = [*model.parameters(), *model.buffers()]
    for module in model.modules():
        tensors += [v for v in vars(module).values() if isinstance(v, torch.Tensor)]
    for tensor in tensors:
        if tensor.is_meta:
            continue
        if tensor.layout != torch.strided:  # oneDNN's packed weight: opaque, no data pointer
            total += tensor.numel() * tensor.element_size()
            continue
        key = (tensor.data_ptr(), tensor.nbytes)
        if key not in seen:
            seen.add(key)
            total += tensor.nbytes
    return total


def measure(case: dict) -> dict:
    import torch

    from hetero_core.model.cpu.int8_linear import Quantization
    from hetero_core.model.cpu.kernels import KernelUnavailable, load_cpu_kernels
    from hetero_core.model.cpu.prepared_weights import load_packed_model
    from hetero_core.model.cpu.torch_attention import TorchPagedAttention
    from hetero_core.model.loader import load_model
    from hetero_core.model.tensor_parallel import TensorParallelShard

    dtype = getattr(torch, case["dtype"])
    try:
        kernels = load_cpu_kernels(required=True) if case["path"] in ("packed", *QUANTIZED) else None
    except KernelUnavailable:
        kernels = None
    backend = TorchPagedAttention()
    if case["model_dir"].endswith(".gguf"):  # its reader's module, imported before the load as torch is
        import gguf.quants  # noqa: F401
    baseline = status_bytes("VmRSS")
    peak_was_reset = reset_peak()
    if case["path"] in ("packed", *QUANTIZED):
        quantization = Quantization(case["path"], 32, kernels) if case["path"] in QUANTIZED else None
        model = load_packed_model(
            case["model_dir"],
            Path(case["cache_dir"]),
            backend=backend,
            dtype=dtype,
            kernels=kernels,
            quantization=quantization,
        )
    elif case["path"] == "shard":
        shard = TensorParallelShard(rank=0, size=2)
        model = load_model(case["model_dir"], backend=backend, dtype=dtype, tensor_parallel=shard)
    else:
        model = load_model(case["model_dir"], backend=backend, dtype=dtype)
    peak = status_bytes("VmHWM")
    return {
        "baseline": baseline,
        "peak": peak,
        "weights": weight_bytes(model),
        "peak_was_reset": peak_was_reset,
        "kernels": kernels is not None,
    }


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(Path(sys.argv[1]).read_text()))))
