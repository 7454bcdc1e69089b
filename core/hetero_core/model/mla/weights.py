"""DeepSeek checkpoint tensors <-> the MLA model's state dict.

Checkpoints keep one tensor per routed expert and projection
(``mlp.experts.<e>.{gate,up,down}_proj.weight``); the model holds each sparse layer's experts stacked
(``mlp.experts.gate_up_proj`` [experts, 2 * intermediate, hidden], gate rows first, and
``mlp.experts.down_proj`` [experts, hidden, intermediate]), as transformers 5 does in memory. Every
other name maps to itself.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from hetero_core.errors import ModelLoadError

_STACKED = {".mlp.experts.gate_up_proj": ("gate_proj", "up_proj"), ".mlp.experts.down_proj": ("down_proj",)}


def _parts(name: str, config) -> list[list[str]] | None:
    """Per projection of a stacked tensor, its per-expert checkpoint names; None for any other name."""
    for suffix, projections in _STACKED.items():
        if name.endswith(suffix):
            prefix = name[: -len(suffix)]
            experts = range(int(config.moe["n_routed_experts"]))
            return [[f"{prefix}.mlp.experts.{e}.{p}.weight" for e in experts] for p in projections]
    return None


def checkpoint_names(model_names: Iterable[str], config) -> list[str]:
    names = []
    for name in model_names:
        parts = _parts(name, config)
        names.extend([name] if parts is None else [n for group in parts for n in group])
    return names


def from_checkpoint(state: dict[str, torch.Tensor], model_names: Iterable[str], config) -> dict[str, torch.Tensor]:
    tensors = {}
    for name in model_names:
        parts = _parts(name, config)
        if parts is None:
            tensors[name] = state[name]
            continue
        try:  # [experts][gate rows; up rows] or [experts][down]
            tensors[name] = torch.cat([torch.stack([state[n] for n in group]) for group in parts], dim=1)
        except RuntimeError as exc:
            raise ModelLoadError(f"checkpoint does not match its config.json: {name}: {exc}") from exc
    return tensors


def to_checkpoint(state: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in state.items():
        parts = _parts(name, config)
        if parts is None:
            out[name] = tensor
            continue
        for group, piece in zip(parts, tensor.chunk(len(parts), dim=1), strict=True):
            out.update({n: piece[e] for e, n in enumerate(group)})
    return out
