"""A MoE layer's experts in the layout of the compiled kernels' linear (CPU).

``pack_experts`` replaces each ``moe.experts.Experts`` of a model with ``PackedExperts``: every
expert's gate/up weight packed for the kernels' SwiGLU linear (``silu(gate) * up`` straight from the
registers) and its down weight for the plain one, in the model's dtype (``bf16_linear`` in bf16,
``f32_linear`` in fp32), stacked so expert ``e``'s weight is one contiguous slice. A step groups its
(token, expert) pairs by expert as the model code does and makes two kernel calls per expert that any
token chose, over all of that expert's tokens; experts no token chose cost nothing. The kernels'
linears give a row the same result whatever its batch-mates, so an expert's output for a token never
depends on which other tokens chose it.

The router and Qwen2-MoE's shared-expert gate (a few output rows each) run in the same kernels, their
weights padded with zero rows to whole panels (``NarrowLinear``): with the compiled kernels a
token's routing, and so its output, does not depend on its batch-mates either (batch invariance).

Where the kernels' layout does not take the weights (intermediate sizes not a multiple of 16, bf16
with an odd hidden size, another dtype) the experts stay as they are (torch matmuls per expert).
"""

from __future__ import annotations

import torch
from torch import nn

from hetero_core.model.cpu.kernel_linears import PANEL
from hetero_core.model.cpu.linear import kernel_layout
from hetero_core.model.moe.block import SharedExpertGate
from hetero_core.model.moe.experts import Experts, run_grouped
from hetero_core.model.moe.router import TopKRouter


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
        return run_grouped(self, hidden, weights, ids)

    def run_expert(self, expert: int, rows: torch.Tensor) -> torch.Tensor:
        linear = self.kernels.bf16_linear if self.layout == "bf16" else self.kernels.f32_linear
        return linear(linear(rows, self.gate_up[expert], None, swiglu=True), self.down[expert], None)


class NarrowLinear:
    """``x @ weight.T`` for a weight of a few rows ([N, K], N under a panel or not a whole number of
    them) in the kernels' linear: padded with zero rows to whole panels, the padding's columns cut
    off the fp32 result. ``NarrowLinear.pack`` returns None where the kernels' layout does not apply."""

    def __init__(self, kernels, packed: torch.Tensor, layout: str, rows: int):
        self.kernels, self.packed, self.layout, self.rows = kernels, packed, layout, rows

    @classmethod
    def pack(cls, weight: torch.Tensor, kernels) -> NarrowLinear | None:
        layout = kernel_layout(kernels, weight.dtype)
        if layout not in ("bf16", "f32") or weight.device.type != "cpu":
            return None
        rows = weight.shape[0]
        padded = torch.zeros((-(-rows // PANEL) * PANEL, weight.shape[1]), dtype=weight.dtype)
        padded[:rows] = weight.detach()
        packed = kernels.pack_bf16_linear(padded) if layout == "bf16" else kernels.pack_f32_linear(padded)
        return None if packed is None else cls(kernels, packed, layout, rows)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.layout == "bf16":
            out = self.kernels.bf16_linear(x.to(torch.bfloat16), self.packed, None, torch.float32)
        else:
            out = self.kernels.f32_linear(x, self.packed, None)
        return out[:, : self.rows]


def pack_router(router: TopKRouter, kernels) -> bool:
    """The router's logits through the kernels' linear (fp32 sums); False where it cannot."""
    linear = NarrowLinear.pack(router.weight, kernels)
    if linear is not None:
        router.router_logits = linear
    return linear is not None


def pack_shared_expert_gate(gate: SharedExpertGate, kernels) -> bool:
    """The shared expert's gate through the kernels' linear; False where it cannot."""
    linear = NarrowLinear.pack(gate.weight, kernels)
    if linear is not None:
        gate.forward = lambda hidden: linear(hidden).to(hidden.dtype)
    return linear is not None


def pack_experts(model: nn.Module, kernels) -> int:
    """Replace every ``Experts`` inside ``model`` whose weights the kernels' layout takes by
    ``PackedExperts``, and run the routers and shared-expert gates in the kernels' linear; return how
    many experts modules were replaced."""
    if kernels is None:
        return 0
    replaced = 0
    for module in list(model.modules()):
        if isinstance(module, TopKRouter):
            pack_router(module, kernels)
        elif isinstance(module, SharedExpertGate):
            pack_shared_expert_gate(module, kernels)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Experts):
                packed = PackedExperts.pack(child, kernels)
                if packed is not None:
                    setattr(parent, name, packed)
                    replaced += 1
    return replaced
