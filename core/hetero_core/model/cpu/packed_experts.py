"""A MoE layer's experts in the layout of the compiled kernels' linear (CPU).

``pack_experts`` replaces each ``moe.experts.Experts`` of a model with ``PackedExperts``: every
expert's gate/up weight packed for the kernels' SwiGLU linear (``silu(gate) * up`` straight from the
registers) and its down weight for the plain one, in the model's dtype (``bf16_linear`` in bf16,
``f32_linear`` in fp32), stacked so expert ``e``'s weight is one contiguous slice. A step groups its
(token, expert) pairs by expert as the model code does and makes two kernel calls per expert that any
token chose, over all of that expert's tokens; experts no token chose cost nothing. The kernels'
linears give a row the same result whatever its batch-mates, so an expert's output for a token never
depends on which other tokens chose it.

Where the kernels' layout does not take the weights (intermediate sizes not a multiple of 16, bf16
with an odd hidden size, another dtype) the experts stay as they are (torch matmuls per expert).
"""

from __future__ import annotations

import torch
from torch import nn

from hetero_core.model.cpu.linear import kernel_layout
from hetero_core.model.moe.experts import Experts, combine, group_by_expert


class PackedExperts(nn.Module):
    """``forward(hidden, weights, ids)`` as ``Experts``'; ``gate_up`` / ``down``: the stacked packed
    weights (plain attributes: a packed model's ``state_dict`` holds no expert weights)."""

    def __init__(self, experts: Experts, kernels, gate_up: torch.Tensor, down: torch.Tensor, layout: str):
        super().__init__()
        self.kernels = kernels
        self.gate_up = gate_up
        self.down = down
        self.layout = layout
        self.num_local_experts = experts.num_local_experts
        self.first_expert = experts.first_expert
        self.num_global_experts = experts.num_global_experts

    @classmethod
    def pack(cls, experts: Experts, kernels) -> PackedExperts | None:
        """``experts`` packed for ``kernels``' linear of their dtype, or None where it does not take them."""
        dtype = experts.gate_up_proj.dtype
        layout = kernel_layout(kernels, dtype)
        if layout not in ("bf16", "f32") or experts.gate_up_proj.device.type != "cpu":
            return None
        pack = kernels.pack_bf16_linear if layout == "bf16" else kernels.pack_f32_linear
        gate_up = [pack(weight, swiglu=True) for weight in experts.gate_up_proj]
        down = [pack(weight) for weight in experts.down_proj]
        if any(w is None for w in [*gate_up, *down]):
            return None
        return cls(experts, kernels, torch.stack(gate_up), torch.stack(down), layout)

    def forward(self, hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        is_all = self.num_local_experts == self.num_global_experts
        groups = group_by_expert(ids, self.first_expert, None if is_all else self.num_local_experts)
        rows = hidden[groups.token_rows]
        out = torch.empty_like(rows)
        linear = self.kernels.bf16_linear if self.layout == "bf16" else self.kernels.f32_linear
        for expert, start, end in groups.spans:
            activation = linear(rows[start:end], self.gate_up[expert], None, swiglu=True)
            out[start:end] = linear(activation, self.down[expert], None)
        return combine(out, groups, weights, hidden)


def has_experts(model: nn.Module) -> bool:
    """True for a model with MoE experts (packed or not)."""
    return any(isinstance(m, (Experts, PackedExperts)) for m in model.modules())


def pack_experts(model: nn.Module, kernels) -> int:
    """Replace every ``Experts`` inside ``model`` whose weights the kernels' layout takes by
    ``PackedExperts``; return how many."""
    if kernels is None:
        return 0
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Experts):
                packed = PackedExperts.pack(child, kernels)
                if packed is not None:
                    setattr(parent, name, packed)
                    replaced += 1
    return replaced
