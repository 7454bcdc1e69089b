"""Random-weight checkpoints of every registered architecture at its benchmark size, for
``hetero bench models``.

Each architecture that registers a ``bench_config()`` (``hetero_core.architectures.ModelArchitecture``) gets
a directory under ``<cache_dir>/random-models/``: that ``config.json`` and safetensors whose names
and shapes come from the architecture itself (its module built on the meta device, its weight
mapping back to checkpoint names), so an architecture registered later (MoE, MLA) is benchmarked
without edits here. Weights as ``random_models``: norms (1-D) ones, the rest N(0, 0.02^2) seeded by
the tensor's name. A ``random-model.json`` written last marks a directory complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from hetero_bench.random_models import MARKER, copy_tokenizer, default_cache_dir, random_tensor

FORMAT = 1


def bench_architectures(registry) -> list[tuple[str, object]]:
    """(name, architecture) of every architecture in ``registry`` with a bench config, by name."""
    return [
        (name, registry.get(name))
        for name in registry.names()
        if name in registry.entries and registry.get(name).bench_config is not None
    ]


def bench_config(name: str, architecture, overrides: dict) -> dict:
    return {**architecture.bench_config(), "architectures": [name], **overrides}


def checkpoint_shapes(name: str, architecture, raw: dict) -> tuple[object, dict[str, tuple[int, ...]]]:
    """The parsed config and the checkpoint's tensor names and shapes (the module on the meta device)."""
    import torch

    config = architecture.config(raw, f"{name} bench config")
    with torch.device("meta"):
        module = architecture.build(config, None)
    state = architecture.weights.to_checkpoint(module.state_dict(), config)
    return config, {tensor_name: tuple(tensor.shape) for tensor_name, tensor in state.items()}


def architecture_checkpoint(
    name: str, architecture, raw: dict, dtype: str, cache_dir: Path | None = None, tokenizer: bool = False
) -> Path:
    """The directory of ``name``'s random checkpoint for config ``raw`` in ``dtype``, made on first use;
    ``tokenizer``: with the embedded SmolLM2's tokenizer files (49,152 tokens)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    digest = hashlib.sha256(json.dumps([FORMAT, raw, dtype, tokenizer], sort_keys=True).encode()).hexdigest()[
        :10
    ]
    target = root / "random-models" / f"arch-{name}-{dtype}-{digest}"
    if (target / MARKER).is_file():
        return target
    import torch
    from safetensors.torch import save_file

    _, shapes = checkpoint_shapes(name, architecture, raw)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        (tmp / "config.json").write_text(json.dumps({**raw, "torch_dtype": dtype}, indent=1))
        if tokenizer:
            copy_tokenizer(tmp, root)
        tensors = {n: random_tensor(n, shape).to(getattr(torch, dtype)) for n, shape in shapes.items()}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / MARKER).write_text(json.dumps({"format": FORMAT, "dtype": dtype}))
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def num_parameters(shapes: dict[str, tuple[int, ...]]) -> int:
    total = 0
    for shape in shapes.values():
        count = 1
        for size in shape:
            count *= size
        total += count
    return total
