"""The router: softmax over every expert's logit, then the top k, renormalised where the model says."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class TopKRouter(nn.Module):
    """``weight`` [num_experts, hidden] (HF's ``mlp.gate.weight``). ``forward(hidden)`` ->
    ``(weights [tokens, k], expert ids [tokens, k])``: the probabilities (softmax in fp32, as HF
    computes them) of each token's ``k`` most likely experts, divided by their sum with
    ``normalize``; cast to ``hidden``'s dtype unless ``fp32_weights``. Not a ``nn.Linear``: weight
    packing leaves it as it is (routing decisions flip on small differences)."""

    def __init__(
        self, num_experts: int, hidden_size: int, top_k: int, normalize: bool, fp32_weights: bool = False
    ):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.top_k = top_k
        self.normalize = normalize
        self.fp32_weights = fp32_weights

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = self.router_logits(hidden).float().softmax(dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return (weights if self.fp32_weights else weights.to(hidden.dtype)), ids

    def router_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[tokens, num_experts]`` (the CPU runtime's packed router replaces this)."""
        return F.linear(hidden, self.weight)
