"""The sparse MLP of an MoE decoder layer: router, experts and, where the model has one, a shared
expert (Qwen2-MoE: a SwiGLU every token runs, scaled by ``sigmoid(shared_expert_gate(x))``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from hetero_core.model.layers import SwiGLU
from hetero_core.model.moe.config import MoeConfig
from hetero_core.model.moe.experts import Experts
from hetero_core.model.moe.router import TopKRouter


class SharedExpertGate(nn.Module):
    """``weight`` [1, hidden]: the shared expert's scalar gate logit per token (not a ``nn.Linear``:
    ``pack_linears`` leaves it as it is; the CPU runtime packs it its own way, ``packed_experts``)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(1, hidden_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight)


class SparseMoeBlock(nn.Module):
    """``forward(hidden [tokens, hidden]) -> [tokens, hidden]``. Parameter names follow HF's
    (``gate.weight``, ``experts.gate_up_proj``, ``experts.down_proj``, ``shared_expert.*``,
    ``shared_expert_gate.weight``); the shared expert's gate and up are fused as the dense MLP's are.
    Expert parallelism swaps ``experts`` for a module with the same call (``expert_parallel``);
    tensor parallelism without it sets ``reduce_output``, which adds the ranks' partial sums
    (``sharded_experts``)."""

    def __init__(self, hidden_size: int, moe: MoeConfig):
        super().__init__()
        self.gate = TopKRouter(
            moe.num_experts, hidden_size, moe.num_experts_per_tok, moe.norm_topk_prob, moe.router_weights_fp32
        )
        local = moe.local_experts
        self.experts = Experts(
            len(local), hidden_size, moe.moe_intermediate_size, local.start, moe.num_experts
        )
        if moe.shared_expert_intermediate_size:
            self.shared_expert = SwiGLU(hidden_size, moe.shared_expert_intermediate_size, bias=False)
            self.shared_expert_gate = SharedExpertGate(hidden_size)
        else:
            self.shared_expert = self.shared_expert_gate = None
        self.reduce_output = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(hidden)
        out = self.experts(hidden, weights, ids)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(hidden)) * self.shared_expert(hidden)
        return out if self.reduce_output is None else self.reduce_output(out)
