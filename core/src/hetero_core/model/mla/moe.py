"""DeepSeek's mixture-of-experts MLP: its router and shared experts around the stacked experts of
``hetero_core.model.moe.experts`` (run grouped by expert).

- DeepSeek-V2 (``scoring_func`` softmax): the top ``num_experts_per_tok`` of the softmax over every
  expert (``topk_method`` greedy), or only among the ``topk_group`` groups (of ``n_group``) with the
  highest single score (group_limited_greedy);
- DeepSeek-V3 (sigmoid, ``noaux_tc``): experts chosen by ``sigmoid + e_score_correction_bias`` among
  the ``topk_group`` groups with the highest sum of their two best such scores, weighted by the
  plain sigmoid;

both renormalised where ``norm_topk_prob`` says, times ``routed_scaling_factor``. Every token also
runs the shared experts (one SwiGLU of ``n_shared_experts * moe_intermediate_size``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from hetero_core.errors import ModelLoadError
from hetero_core.model.mla.config import MLAConfig

TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


class DeepseekRouter(nn.Module):
    """``weight`` [experts, hidden] (``mlp.gate.weight``; not a ``nn.Linear``: packing leaves it
    alone, routing flips on small differences). ``forward(hidden)`` -> (weights [tokens, k] fp32,
    expert ids [tokens, k])."""

    def __init__(self, config: MLAConfig):
        super().__init__()
        moe = config.moe
        self.num_experts = int(moe["n_routed_experts"])
        self.top_k = int(moe["num_experts_per_tok"])
        self.v3 = config.architecture == "DeepseekV3ForCausalLM"
        self.method = "noaux_tc" if self.v3 else (moe.get("topk_method") or "greedy")
        if self.method not in TOPK_METHODS or (self.v3 and moe.get("topk_method") not in (None, "noaux_tc")):
            raise ModelLoadError(
                f"{config.architecture}: topk_method {moe.get('topk_method')!r} is not supported; "
                f"supported: greedy, group_limited_greedy (V2), noaux_tc (V3)"
            )
        self.num_groups = int(moe.get("n_group") or 1)
        self.topk_group = int(moe.get("topk_group") or self.num_groups)
        if self.method != "greedy" and self.num_experts % self.num_groups:
            raise ModelLoadError(
                f"{config.architecture}: n_routed_experts {self.num_experts} is not a multiple of "
                f"n_group {self.num_groups}"
            )
        self.normalize = bool(moe.get("norm_topk_prob")) and (self.v3 or self.top_k > 1)
        self.scaling = float(moe.get("routed_scaling_factor") or 1.0)
        self.weight = nn.Parameter(torch.empty(self.num_experts, config.hidden_size))
        if self.v3:
            self.register_buffer("e_score_correction_bias", torch.empty(self.num_experts))

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(hidden.float(), self.weight.float())
        if self.v3:
            scores = logits.sigmoid()
            choice = scores + self.e_score_correction_bias.float()
            group_scores = (
                choice.view(-1, self.num_groups, self.num_experts // self.num_groups)
                .topk(2, dim=-1)[0]
                .sum(-1)
            )
            ids = torch.topk(self._keep_groups(choice, group_scores, float("-inf")), self.top_k, dim=-1)[1]
            weights = scores.gather(1, ids)
        else:
            scores = logits.softmax(dim=-1)
            if self.method == "group_limited_greedy":
                group_scores = scores.view(-1, self.num_groups, self.num_experts // self.num_groups).amax(
                    dim=-1
                )
                scores = self._keep_groups(scores, group_scores, 0.0)
            weights, ids = torch.topk(scores, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.scaling, ids

    def _keep_groups(self, scores: torch.Tensor, group_scores: torch.Tensor, fill: float) -> torch.Tensor:
        """``scores`` with every expert outside each token's ``topk_group`` best groups set to ``fill``."""
        groups = torch.topk(group_scores, self.topk_group, dim=-1)[1]
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
        keep = keep.repeat_interleave(self.num_experts // self.num_groups, dim=1)
        return scores.masked_fill(~keep, fill)


class DeepseekMoE(nn.Module):
    """``mlp`` of a sparse layer: ``gate`` (the router), ``experts`` (stacked: ``gate_up_proj``,
    ``down_proj``), ``shared_experts`` (``gate_proj``/``up_proj``/``down_proj``)."""

    def __init__(self, config: MLAConfig, shared_experts: nn.Module, experts: nn.Module):
        super().__init__()
        self.gate = DeepseekRouter(config)
        self.experts = experts
        self.shared_experts = shared_experts

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(hidden)
        return self.experts(hidden, weights, ids) + self.shared_experts(hidden)
