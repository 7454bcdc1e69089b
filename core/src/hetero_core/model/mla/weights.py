"""DeepSeek checkpoint tensors <-> the MLA model's state dict.

Checkpoints keep one tensor per routed expert and projection
(``mlp.experts.<e>.{gate,up,down}_proj.weight``); the model holds each sparse layer's experts stacked
(``mlp.experts.gate_up_proj`` [experts, 2 * intermediate, hidden], gate rows first, and
``mlp.experts.down_proj`` [experts, hidden, intermediate]), as transformers 5 does in memory. The
dense MLPs' and shared experts' ``gate_proj`` and ``up_proj`` are one ``gate_up_proj`` (gate rows
first); the query's first projection and ``kv_a_proj_with_mqa`` are one ``q_kv_a_proj``
(``attention.fused_a_parts``). Every other name maps to itself.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from hetero_core.errors import ModelLoadError
from hetero_core.model.mla.attention import fused_a_parts

_STACKED = {".mlp.experts.gate_up_proj": ("gate_proj", "up_proj"), ".mlp.experts.down_proj": ("down_proj",)}


def _parts(name: str, config) -> list[list[str]] | None:
    """Per projection of a stacked or fused tensor, its checkpoint names (one per expert, or the one
    projection); None for any other name."""
    module, _, param = name.rpartition(".")
    if module.endswith(".gate_up_proj") and not module.endswith(".experts.gate_up_proj"):
        prefix = module[: -len("gate_up_proj")]
        return [[f"{prefix}gate_proj.{param}"], [f"{prefix}up_proj.{param}"]]
    if module.endswith(".q_kv_a_proj"):
        prefix = module[: -len("q_kv_a_proj")]
        return [[f"{prefix}{part}.{param}"] for part, _ in fused_a_parts(config)]
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


def from_checkpoint(
    state: dict[str, torch.Tensor], model_names: Iterable[str], config
) -> dict[str, torch.Tensor]:
    tensors = {}
    for name in model_names:
        parts = _parts(name, config)
        if parts is None:
            tensors[name] = state[name]
            continue
        try:  # [experts][gate rows; up rows], [experts][down], or [gate rows; up rows]
            if name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
                tensors[name] = torch.cat([torch.stack([state[n] for n in group]) for group in parts], dim=1)
            else:
                tensors[name] = torch.cat([state[group[0]] for group in parts], dim=0)
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
        if not name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
            rows = (
                [r for _, r in fused_a_parts(config)]
                if ".q_kv_a_proj." in name
                else [tensor.shape[0] // 2] * 2
            )
            out.update({group[0]: piece for group, piece in zip(parts, tensor.split(rows), strict=True)})
            continue
        for group, piece in zip(parts, tensor.chunk(len(parts), dim=1), strict=True):
            out.update({n: piece[e] for e, n in enumerate(group)})
    return out
