"""The experts of one MoE layer, stacked, run grouped by expert.

The weights are two stacked tensors (as transformers 5 holds them): ``gate_up_proj``
[num_experts, 2 * intermediate, hidden] (each expert's gate rows, then its up rows) and ``down_proj``
[num_experts, hidden, intermediate]. A step sorts its (token, expert) pairs by expert
(``group_by_expert``), runs one gate/up and one down matmul per expert that any token chose, over
all of that expert's tokens at once, and adds each result, times its routing weight, into its
token's row (``index_add_``, in expert order). Experts no token chose cost nothing.

Expert parallelism keeps a slice of the experts on each rank (``first_expert``,
``num_local_experts``): pairs routed to other ranks' experts are left out here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class ExpertGroups:
    """A step's (token, expert) pairs for the local experts, grouped by expert: ``token_rows`` and
    ``pair_index`` (into the flattened [tokens * k] routing tensors) in that order; ``spans``:
    ``(local expert, start, end)`` of each expert with tokens, in expert order."""

    token_rows: torch.Tensor
    pair_index: torch.Tensor
    spans: tuple[tuple[int, int, int], ...]


def group_by_expert(
    ids: torch.Tensor, first_expert: int = 0, num_local_experts: int | None = None
) -> ExpertGroups:
    """``ids`` [tokens, k] (global expert ids) -> the pairs of experts ``first_expert`` ..
    ``first_expert + num_local_experts - 1`` (every expert: None), grouped by expert."""
    top_k = ids.shape[1]
    local = ids.reshape(-1) - first_expert
    pair_index = None
    if num_local_experts is not None:
        pair_index = ((local >= 0) & (local < num_local_experts)).nonzero().flatten()
        local = local[pair_index]
    order = torch.argsort(local, stable=True)
    pair_index = order if pair_index is None else pair_index[order]
    counts = torch.bincount(local, minlength=num_local_experts or 0).tolist()  # one host sync per layer
    spans, start = [], 0
    for expert, count in enumerate(counts):
        if count:
            spans.append((expert, start, start + count))
            start += count
    return ExpertGroups(torch.div(pair_index, top_k, rounding_mode="floor"), pair_index, tuple(spans))


class Experts(nn.Module):
    """``forward(hidden [tokens, hidden], weights [tokens, k], ids [tokens, k])`` -> ``[tokens, hidden]``:
    each token's sum over its chosen (local) experts of ``weight * down(silu(gate(x)) * up(x))``.
    ``run_expert`` is the one place a single expert runs (the CPU runtime's packed experts replace it)."""

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        first_expert: int = 0,
        num_global_experts: int | None = None,
    ):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.num_local_experts = num_experts
        self.first_expert = first_expert
        self.num_global_experts = num_global_experts or num_experts

    def forward(self, hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return run_grouped(self, hidden, weights, ids)

    def run_expert(self, expert: int, rows: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(rows, self.gate_up_proj[expert]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj[expert])


def run_grouped(experts, hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``experts``' forward (an ``Experts`` or the CPU runtime's packed ones: ``run_expert``,
    ``first_expert``, ``num_local_experts``, ``num_global_experts``). One token with every expert
    local (a decode step of one sequence) skips the grouping: its experts in expert order, the same
    arithmetic as the grouped path, so the same bits."""
    is_all = experts.num_local_experts == experts.num_global_experts
    if hidden.shape[0] == 1 and is_all:
        chosen = ids[0].tolist()
        total = None
        for slot in sorted(range(len(chosen)), key=chosen.__getitem__):
            scaled = (experts.run_expert(chosen[slot], hidden) * weights[0, slot]).to(hidden.dtype).float()
            total = scaled if total is None else total + scaled
        return total.to(hidden.dtype)
    groups = group_by_expert(ids, experts.first_expert, None if is_all else experts.num_local_experts)
    rows = hidden[groups.token_rows]
    out = torch.empty_like(rows)
    for expert, start, end in groups.spans:
        out[start:end] = experts.run_expert(expert, rows[start:end])
    return combine(out, groups, weights, hidden)


def combine(
    out: torch.Tensor, groups: ExpertGroups, weights: torch.Tensor, hidden: torch.Tensor
) -> torch.Tensor:
    """``out`` (the experts' rows, grouped) times their routing weights, added into their tokens' rows
    (``weighted_sum``)."""
    return weighted_sum(out, weights.reshape(-1)[groups.pair_index], groups.token_rows, hidden)


def weighted_sum(
    rows: torch.Tensor, row_weights: torch.Tensor, token_rows: torch.Tensor, hidden: torch.Tensor
) -> torch.Tensor:
    """``rows[i] * row_weights[i]`` (each product rounded to the model's dtype, as transformers rounds
    it) added into row ``token_rows[i]`` of a zero ``hidden``-shaped tensor, in the order given. The
    sums are fp32, rounded once: in bf16 transformers rounds after each expert instead (a last-bit
    difference), and torch's bf16 ``index_add_`` is several times slower than its fp32 one."""
    scaled = (rows * row_weights.unsqueeze(1)).to(hidden.dtype)
    total = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    return total.index_add_(0, token_rows, scaled.float()).to(hidden.dtype)
