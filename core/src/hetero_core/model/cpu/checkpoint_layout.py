"""What a checkpoint's compute depends on, apart from its values: the config's shapes and each tensor's
name, size and stored type.

Two checkpoints with one layout run the same kernels on the same shapes, so a step takes them the
same time: every fine-tune of a base model, a re-download, a copy elsewhere. ``dtype = "auto"``'s
timed steps are remembered under the layout (``torch_auto_dtype``), so they are measured once per
layout on a CPU, not once per model folder. Read from the headers only (safetensors' JSON headers, a
GGUF's tensor table): nothing of the weights is read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path

from hetero_core.model.cpu.probe_model import read_config
from hetero_core.model.source import resolve_model_source

# ModelConfig fields that change what a step computes (not eps, RoPE's base, token ids, names)
SHAPE_FIELDS = (
    "architecture",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "qk_norm",
)


def checkpoint_layout(source: str | Path) -> str:
    """A digest of ``source``'s layout (a model folder, a converted GGUF's folder, a .gguf file)."""
    source = resolve_model_source(source)
    config = dataclasses.asdict(read_config(source))
    shapes = {name: config[name] for name in SHAPE_FIELDS if name in config}
    layout = {"config": shapes, "tensors": _tensors(source)}
    return hashlib.sha256(json.dumps(layout, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _tensors(source: Path) -> list[tuple[str, int, str]]:
    """Each tensor as (name, elements, stored type), in name order (the shapes are the config's)."""
    gguf = _gguf_file(source)
    if gguf is not None:  # its tensor table alone (``weight_size``: the metadata stepped over)
        from hetero_core.model.cpu.weight_size import GGUF_TYPES, gguf_tensor_infos

        table = [(name, n, GGUF_TYPES.get(t, str(t))) for name, n, t in gguf_tensor_infos(gguf)]
    else:
        from hetero_core.model.safetensors_checkpoint import read_safetensors

        tensors = read_safetensors(source)
        table = [(name, math.prod(tensors.shape(name)), str(tensors.dtype(name))) for name in tensors]
    return sorted(table)


def _gguf_file(source: Path) -> Path | None:
    if not source.is_dir():
        return source
    from hetero_core.model.gguf_cache import gguf_source

    return gguf_source(source)
