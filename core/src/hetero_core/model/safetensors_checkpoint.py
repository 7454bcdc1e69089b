"""Read the weights of a Hugging Face directory: one ``model.safetensors`` or shards listed in
``model.safetensors.index.json``; read lazily (``checkpoint_tensors``)."""

from __future__ import annotations

import json
from pathlib import Path

from hetero_core.errors import ModelLoadError
from hetero_core.model.checkpoint_tensors import SafetensorsTensors

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def safetensors_files(model_dir: Path) -> list[Path]:
    """The weight files of ``model_dir``, in index order (each shard once)."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError) as exc:
            raise ModelLoadError(f"cannot read {index}: {exc}; expected a 'weight_map' object") from exc
        shards = [model_dir / name for name in dict.fromkeys(weight_map.values())]
        missing = [str(p.name) for p in shards if not p.is_file()]
        if missing:
            raise ModelLoadError(
                f"{index} lists missing shard(s): {', '.join(missing)}; re-download the model"
            )
        return shards
    if (model_dir / SINGLE_FILE).is_file():
        return [model_dir / SINGLE_FILE]
    raise ModelLoadError(
        f"no {SINGLE_FILE} or {INDEX_FILE} in {model_dir}; only safetensors checkpoints are supported"
    )


def read_safetensors(model_dir: Path) -> SafetensorsTensors:
    """The checkpoint's tensors (CPU, their stored dtype), each read when it is asked for."""
    return SafetensorsTensors(safetensors_files(model_dir))
