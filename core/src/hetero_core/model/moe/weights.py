"""Checkpoint tensors <-> the MoE model's state dict: experts stacked, Mixtral's names mapped.

Hugging Face checkpoints keep one tensor per expert and projection: Qwen2/Qwen3-MoE
``mlp.experts.<e>.{gate,up,down}_proj.weight`` and ``mlp.gate.weight``; Mixtral
``block_sparse_moe.experts.<e>.{w1,w3,w2}.weight`` (gate, up, down) and ``block_sparse_moe.gate.weight``.
The model holds each layer's experts stacked (``mlp.experts.gate_up_proj`` [experts, 2 * intermediate,
hidden], gate rows first, and ``mlp.experts.down_proj`` [experts, hidden, intermediate]), as
transformers 5 does in memory. Qwen2-MoE's shared expert gets its gate and up fused
(``mlp.shared_expert.gate_up_proj.weight``). Everything else (attention, dense layers) maps as for
any Llama-family model (``fusion``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from hetero_core.errors import ModelLoadError
from hetero_core.model import fusion
from hetero_core.model.moe.config import MoeModelConfig

_EXPERT_PARTS = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}
_MIXTRAL_NAMES = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def checkpoint_names(model_names: Iterable[str], config: MoeModelConfig) -> list[str]:
    """The checkpoint tensor names that make up the model's parameters ``model_names``."""
    names = []
    for name in model_names:
        parts = _parts(name, config)
        names.extend(
            fusion.checkpoint_names([name], config) if parts is None else [part for part, _ in parts]
        )
    return names


def from_checkpoint(
    state: dict[str, torch.Tensor], model_names: Iterable[str], config: MoeModelConfig
) -> dict[str, torch.Tensor]:
    """The model's tensors (by ``model_names``) from the checkpoint's: experts stacked, the shared
    expert's and the dense layers' projections fused."""
    tensors = {}
    for name in model_names:
        parts = _parts(name, config)
        if parts is None:
            tensors.update(fusion.fuse_checkpoint(state, [name], config))
        elif name.endswith(".experts.gate_up_proj"):  # [experts][gate rows; up rows]
            gate, up = (
                _stacked(name, [p for p, role in parts if role == r], state) for r in ("gate_proj", "up_proj")
            )
            tensors[name] = _cat(name, [gate, up], dim=1)
        elif name.endswith(".experts.down_proj"):
            tensors[name] = _stacked(name, [p for p, _ in parts], state)
        elif name.endswith(".shared_expert.gate_up_proj.weight"):
            tensors[name] = _cat(name, [state[p] for p, _ in parts], dim=0)
        else:  # a renamed tensor (Mixtral's router)
            tensors[name] = state[parts[0][0]]
    return tensors


def to_checkpoint(state: dict[str, torch.Tensor], config: MoeModelConfig) -> dict[str, torch.Tensor]:
    """A model's ``state_dict`` under the checkpoint's names (views of the stacked tensors)."""
    out = {}
    for name, tensor in state.items():
        parts = _parts(name, config)
        if parts is None:
            out.update(fusion.split_state({name: tensor}, config))
        elif name.endswith(".experts.gate_up_proj"):
            gate, up = tensor.chunk(2, dim=1)
            for index, (part, role) in enumerate(parts):
                out[part] = (gate if role == "gate_proj" else up)[index % len(gate)]
        elif name.endswith(".experts.down_proj"):
            for index, (part, _) in enumerate(parts):
                out[part] = tensor[index]
        elif name.endswith(".shared_expert.gate_up_proj.weight"):
            for (part, _), piece in zip(parts, tensor.chunk(2, dim=0), strict=True):
                out[part] = piece
        else:
            out[parts[0][0]] = tensor
    return out


def _parts(name: str, config: MoeModelConfig) -> list[tuple[str, str]] | None:
    """The checkpoint names (with their role) of an MoE block's parameter ``name``; None otherwise."""
    moe = config.moe
    prefix, found, rest = name.partition(".mlp.")
    if (
        not found
        or not prefix.startswith("model.layers.")
        or int(prefix.rsplit(".", 1)[1]) not in moe.sparse_layers
    ):
        return None
    mixtral = config.architecture == "MixtralForCausalLM"
    block = f"{prefix}.block_sparse_moe" if mixtral else f"{prefix}.mlp"
    if rest.startswith("experts."):
        roles = _EXPERT_PARTS[rest.removeprefix("experts.")]
        return [
            (f"{block}.experts.{e}.{_MIXTRAL_NAMES[r] if mixtral else r}.weight", r)
            for r in roles
            for e in moe.local_experts
        ]
    if rest == "shared_expert.gate_up_proj.weight":
        return [
            (f"{block}.shared_expert.gate_proj.weight", "gate_proj"),
            (f"{block}.shared_expert.up_proj.weight", "up_proj"),
        ]
    return [(f"{block}.{rest}", rest)]


def _stacked(name: str, parts: list[str], state: dict[str, torch.Tensor]) -> torch.Tensor:
    try:
        return torch.stack([state[p] for p in parts])
    except RuntimeError as exc:
        raise ModelLoadError(f"checkpoint does not match its config.json: {name}: {exc}") from exc


def _cat(name: str, tensors: list[torch.Tensor], dim: int) -> torch.Tensor:
    try:
        return torch.cat(tensors, dim=dim)
    except RuntimeError as exc:
        raise ModelLoadError(f"checkpoint does not match its config.json: {name}: {exc}") from exc
