"""Tensor parallelism of a MoE layer without expert parallelism: every rank holds every expert, but
only its ``1/size`` slice of each expert's intermediate columns (Megatron-style, as the dense MLP is
split): gate/up rows and down columns, the shared expert's too. Each rank's block output is then a
partial sum (the routing weights and the shared expert's sigmoid gate are applied per token, so they
distribute over the ranks' parts) and one all-reduce per MoE layer adds them. Imports no torch (the
builder checks the sizes before any worker starts). The router and the
shared-expert gate are whole on every rank, so every rank routes every token the same way.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from hetero_core.errors import ConfigError
from hetero_core.model.moe.config import MoeModelConfig

if TYPE_CHECKING:
    import torch

_ROWS = ("gate_proj", "up_proj", "w1", "w3")  # output rows: the intermediate columns of gate and up
_COLUMNS = ("down_proj", "w2")  # input columns of down


def check_sharded_experts(config, size: int) -> None:
    """Refuse, in one line, expert widths ``size`` does not divide (no-op for a model without experts)."""
    moe = getattr(config, "moe", None)
    if moe is None or size == 1:
        return
    widths = {
        "moe_intermediate_size": moe.moe_intermediate_size,
        "shared_expert_intermediate_size": moe.shared_expert_intermediate_size,
    }
    problems = [f"{name} {value}" for name, value in widths.items() if value % size]
    if problems:
        raise ConfigError(
            f"tensor_parallel_size {size} does not divide the model's {' or '.join(problems)}; "
            "set enable_expert_parallel (experts split whole across the ranks) or another size"
        )


def shard_config(config: MoeModelConfig, size: int) -> MoeModelConfig:
    check_sharded_experts(config, size)
    moe = config.moe
    return replace(
        config,
        moe=replace(
            moe,
            moe_intermediate_size=moe.moe_intermediate_size // size,
            shared_expert_intermediate_size=moe.shared_expert_intermediate_size // size,
        ),
    )


def shard_tensor(name: str, tensor: torch.Tensor, rank: int, size: int) -> torch.Tensor | None:
    """Rank ``rank``'s slice of an expert's or the shared expert's checkpoint tensor; None for any other."""
    if ".experts." not in name and ".shared_expert." not in name:
        return None
    projection = name.rsplit(".", 2)[-2]
    dim = 0 if projection in _ROWS else 1 if projection in _COLUMNS else None
    if dim is None:
        return None
    length = tensor.shape[dim] // size
    return tensor.narrow(dim, rank * length, length).clone()
