"""Checkpoint names <-> the model's fused projections.

The model runs q/k/v as one ``qkv_proj`` matmul and gate/up as one ``gate_up_proj`` matmul (fewer,
larger matmuls, one pass over the activations). Checkpoints keep Hugging Face's separate tensors:
``fuse_checkpoint`` concatenates them along the output dimension when loading, ``split_state``
gives a model's state back under the checkpoint's names.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from hetero_core.errors import ModelLoadError
from hetero_core.model.config import ModelConfig


def fused_projections(config: ModelConfig) -> dict[str, tuple[tuple[str, int], ...]]:
    """Fused module (inside a decoder layer) -> its checkpoint modules and their output sizes, in order."""
    q_size = config.num_attention_heads * config.head_dim
    kv_size = config.num_key_value_heads * config.head_dim
    mlp_size = config.intermediate_size
    return {
        "self_attn.qkv_proj": (
            ("self_attn.q_proj", q_size),
            ("self_attn.k_proj", kv_size),
            ("self_attn.v_proj", kv_size),
        ),
        "mlp.gate_up_proj": (("mlp.gate_proj", mlp_size), ("mlp.up_proj", mlp_size)),
    }


def checkpoint_parts(name: str, config: ModelConfig) -> list[tuple[str, int]] | None:
    """``model.layers.0.mlp.gate_up_proj.weight`` -> ``[(model.layers.0.mlp.gate_proj.weight, rows),
    (model.layers.0.mlp.up_proj.weight, rows)]``; None for a parameter that is not fused."""
    module, _, param = name.rpartition(".")
    for fused, parts in fused_projections(config).items():
        if module.endswith("." + fused):
            prefix = module[: -len(fused)]
            return [(f"{prefix}{part}.{param}", rows) for part, rows in parts]
    return None


def checkpoint_names(model_names: Iterable[str], config: ModelConfig) -> list[str]:
    """The checkpoint tensor names that make up the model's parameters ``model_names``."""
    names = []
    for name in model_names:
        parts = checkpoint_parts(name, config)
        names.extend([name] if parts is None else [part for part, _ in parts])
    return names


def fuse_checkpoint(state: dict[str, torch.Tensor], model_names: Iterable[str], config: ModelConfig):
    """The model's parameters (by ``model_names``) from checkpoint tensors, concatenating fused parts."""
    fused = {}
    for name in model_names:
        parts = checkpoint_parts(name, config)
        if parts is None:
            fused[name] = state[name]
            continue
        tensors = [state[part] for part, _ in parts]  # each read once (``state`` may read on access)
        for (part, rows), tensor in zip(parts, tensors, strict=True):
            if tensor.shape[0] != rows:
                raise ModelLoadError(
                    f"checkpoint does not match its config.json: {part} has {tensor.shape[0]} rows, "
                    f"the config gives {rows}"
                )
        try:
            fused[name] = torch.cat(tensors)
        except RuntimeError as exc:  # parts disagreeing on the input size
            raise ModelLoadError(f"checkpoint does not match its config.json: {name}: {exc}") from exc
    return fused


def split_state(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """A model's ``state_dict`` under the checkpoint's (unfused) names; fused tensors become views."""
    split = {}
    for name, tensor in state.items():
        parts = checkpoint_parts(name, config)
        if parts is None:
            split[name] = tensor
            continue
        for (part, _), piece in zip(parts, tensor.split([rows for _, rows in parts]), strict=True):
            split[part] = piece
    return split
