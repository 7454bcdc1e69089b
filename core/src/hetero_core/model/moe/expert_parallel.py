"""Expert parallelism: a MoE layer's experts split across the ranks of a process group.

Rank ``r`` of ``size`` holds experts ``r * E / size`` .. ``(r + 1) * E / size - 1`` (``shard_config``;
its checkpoint slice keeps only their tensors, ``is_local_tensor``). The attention, norms and dense
layers run as tensor parallelism has them, so every rank enters a MoE layer with the same hidden
states for every token. ``ExpertParallelExperts`` then:

1. takes its slice of the tokens (the ``size`` contiguous slices of the step's rows) and routes them;
2. dispatches: sorts the slice's (token, expert) pairs by expert, so by owning rank, and sends each
   pair's hidden row and expert id to the rank that holds the expert (``all_to_all_single``: the
   counts, then the rows, then the ids);
3. runs its experts over the rows it received, grouped by expert (one matmul pair per expert, as on
   one rank: an expert sees the same rows in the same order as it would there);
4. combines: sends each result back to the rank it came from (``all_to_all_single``), which weights
   and adds them into its tokens' rows in expert order;
5. all-gathers the slices, so every rank again holds every token's output.

gloo (CPU) and NCCL (CUDA) both run ``all_to_all_single`` with uneven splits; only gloo is tested here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hetero_core.model.moe.block import SparseMoeBlock
from hetero_core.model.moe.config import MoeModelConfig, check_expert_parallel
from hetero_core.model.moe.experts import weighted_sum


def shard_config(config: MoeModelConfig, rank: int, size: int) -> MoeModelConfig:
    """``config`` with rank ``rank``'s experts only."""
    check_expert_parallel(config, size)
    local = config.moe.num_experts // size
    return replace(config, moe=replace(config.moe, first_expert=rank * local, num_local_experts=local))


def is_local_tensor(name: str, config: MoeModelConfig) -> bool:
    """False for a checkpoint tensor of an expert ``config`` (a rank's ``shard_config``) does not hold."""
    _, found, rest = name.partition(".experts.")
    if not found or not rest.split(".", 1)[0].isdigit():
        return True
    return int(rest.split(".", 1)[0]) in config.moe.local_experts


def parallelize_experts(model: nn.Module, group: Any = None) -> int:
    """Wrap every MoE block's (local) experts in ``ExpertParallelExperts``; return how many."""
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    for block in blocks:
        block.experts = ExpertParallelExperts(block.experts, block.gate.top_k, group)
    return len(blocks)


class ExpertParallelExperts(nn.Module):
    """``forward(hidden, weights, ids)`` as ``Experts``' (the same result on every rank), with the
    rank's experts in ``local`` (an ``Experts`` or the CPU runtime's packed ones)."""

    def __init__(self, local: nn.Module, top_k: int, group: Any = None):
        super().__init__()
        self.local = local
        self.top_k = top_k
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def forward(self, hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        bounds = [len(t) for t in torch.arange(num_tokens).tensor_split(self.size)]
        start = sum(bounds[: self.rank])
        mine = slice(start, start + bounds[self.rank])
        out = self._experts(hidden[mine], weights[mine], ids[mine])
        return self._gather(out, bounds)

    def _experts(self, hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """This rank's tokens through every rank's experts (dispatch, compute, combine)."""
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)  # by expert, so by owning rank; tokens in order within
        token_rows = torch.div(order, self.top_k, rounding_mode="floor")
        per_rank = self.local.num_local_experts
        send_counts = torch.bincount(flat // per_rank, minlength=self.size)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send_sizes, recv_sizes = send_counts.tolist(), recv_counts.tolist()
        received = self._exchange(hidden[token_rows], recv_sizes, send_sizes)
        received_ids = self._exchange(flat[order].unsqueeze(1), recv_sizes, send_sizes)
        ones = torch.ones(received_ids.shape, dtype=weights.dtype, device=hidden.device)
        results = self.local(received, ones, received_ids)  # each row once: its expert's output, unweighted
        returned = self._exchange(results, send_sizes, recv_sizes)
        return weighted_sum(returned, weights.reshape(-1)[order], token_rows, hidden)

    def _exchange(self, rows: torch.Tensor, recv_sizes: list[int], send_sizes: list[int]) -> torch.Tensor:
        out = rows.new_empty((sum(recv_sizes), *rows.shape[1:]))
        dist.all_to_all_single(
            out,
            rows.contiguous(),
            output_split_sizes=recv_sizes,
            input_split_sizes=send_sizes,
            group=self.group,
        )
        return out

    def _gather(self, out: torch.Tensor, bounds: list[int]) -> torch.Tensor:
        """Every rank's slice of the output rows, in order, on every rank."""
        width = max(bounds)
        padded = out.new_zeros((width, *out.shape[1:]))
        padded[: out.shape[0]] = out
        parts = [torch.empty_like(padded) for _ in range(self.size)]
        dist.all_gather(parts, padded, group=self.group)
        return torch.cat([part[:count] for part, count in zip(parts, bounds, strict=True)])
