"""Tensor parallelism in the model code (Megatron-style), over ``torch.distributed``.

One rank's model is the ordinary ``LlamaForCausalLM`` built from its shard of the checkpoint, with
four kinds of module swapped for parallel ones after loading:

- column-parallel q/k/v and gate/up: no new module. The rank keeps its rows of q_proj, k_proj and
  v_proj (its query heads and its KV heads) and of gate_proj and up_proj; the loader fuses them into
  ``qkv_proj = [q; k; v]`` and ``gate_up_proj = [gate; up]`` as usual, so attention and the MLP run
  on the rank's heads and columns with no communication;
- row-parallel ``o_proj`` and ``down_proj`` (``RowParallelLinear``): the rank keeps its input
  columns, computes a partial sum, and one all-reduce per attention block and one per MLP block
  adds the ranks' parts; the bias is added once, after the reduce;
- the vocabulary-parallel embedding (``VocabParallelEmbedding``): the rank keeps its slice of the
  rows, looks up the ids inside it, zeroes the others and all-reduces;
- the vocabulary-parallel LM head (``VocabParallelLMHead``): the rank computes the logits of its
  vocabulary slice and an all-gather gives every rank the full-width rows;
- a mixture-of-experts layer (``moe``): each expert split as the MLP is, one all-reduce per layer
  (``moe.sharded_experts``), or with expert parallelism whole experts split across the ranks and
  tokens dispatched all-to-all (``moe.expert_parallel``).

Shards are cut before the model is built, so weight packing (``cpu_linear.pack_linears``) sees
only the rank's shard; the parallel modules wrap plain ``nn.Linear`` children, which it packs.
The KV cache of a rank holds its KV heads only. Which sizes fit a model: ``tensor_parallel_plan``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from hetero_core.errors import ConfigError
from hetero_core.model.checkpoint_tensors import DerivedTensors
from hetero_core.model.config import ModelConfig
from hetero_core.model.layers import SwiGLU
from hetero_core.model.model_builder import build_model
from hetero_core.model.moe import expert_parallel, sharded_experts
from hetero_core.model.moe.block import SparseMoeBlock
from hetero_core.model.tensor_parallel_plan import check_tensor_parallel_size, shard_config

# Checkpoint (Hugging Face) tensors, by name suffix, and the dimension each rank takes a slice of.
_ROW_SHARDED = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "embed_tokens",
    "lm_head",
)  # output rows (weight and bias)
_COLUMN_SHARDED = ("self_attn.o_proj", "mlp.down_proj")  # input columns (weight only; the bias is whole)


@dataclass(frozen=True)
class TensorParallelShard:
    """Rank ``rank`` of ``size``; ``group``: the process group (None: the default one);
    ``expert_parallel``: a MoE model's experts split across the ranks, whole (``moe.expert_parallel``),
    instead of every rank holding them all."""

    rank: int
    size: int
    group: Any = None
    expert_parallel: bool = False


def placement(ctx, device: torch.device) -> tuple[TensorParallelShard | None, torch.device]:
    """An executor's shard (None without tensor parallelism) and the device its rank runs on.

    On CUDA global rank ``r`` (``pipeline stage * tensor_parallel_size + tensor-parallel rank``) takes
    the ``r``-th device from the one configured (``cuda`` or ``cuda:0``: ranks 0..world-1 on
    cuda:0..world-1) and makes it the current device, as NCCL expects. With pipeline stages, each
    stage's ranks get a process group of their own (every rank creates every stage's, in order, as
    ``torch.distributed.new_group`` requires)."""
    size, rank = ctx.tensor_parallel_size, ctx.tensor_parallel_rank
    stages, stage = getattr(ctx, "pipeline_parallel_size", 1), getattr(ctx, "pipeline_parallel_rank", 0)
    world = size * stages
    if world == 1:
        return None, device
    if device.type == "cuda":
        first = device.index or 0
        if first + world > torch.cuda.device_count():
            raise ConfigError(
                f"tensor_parallel_size {size} x pipeline_parallel_size {stages} needs CUDA devices "
                f"{first}..{first + world - 1} but {torch.cuda.device_count()} are visible"
            )
        device = torch.device("cuda", first + stage * size + rank)
        torch.cuda.set_device(device)
    elif device.type != "cpu":
        raise ConfigError(
            f"tensor and pipeline parallelism run on CPU (gloo) or CUDA (NCCL) devices, not {device.type!r}"
        )
    if size == 1:
        return None, device
    group = None
    if stages > 1:
        groups = [dist.new_group(list(range(s * size, (s + 1) * size))) for s in range(stages)]
        group = groups[stage]
    return TensorParallelShard(
        rank, size, group=group, expert_parallel=getattr(ctx, "enable_expert_parallel", False)
    ), device


def shard_checkpoint(
    state: Mapping[str, torch.Tensor], config: ModelConfig, shard: TensorParallelShard
) -> DerivedTensors:
    """The rank's part of a checkpoint (Hugging Face names), each slice cut when it is asked for (from
    one full tensor read then; the slice is copied, so the full tensor goes at once). Tensors not
    listed above (norms, q/k norms) are whole on every rank."""
    check_tensor_parallel_size(config, shard.size)
    return DerivedTensors(state, lambda name: _shard_tensor(name, state[name], shard))


def _shard_tensor(name: str, tensor: torch.Tensor, shard: TensorParallelShard) -> torch.Tensor:
    module, _, kind = name.rpartition(".")
    expert = (
        None if shard.expert_parallel else sharded_experts.shard_tensor(name, tensor, shard.rank, shard.size)
    )
    if expert is not None:  # a MoE expert's slice of its intermediate columns
        return expert
    if module.endswith(_ROW_SHARDED):
        return _slice(tensor, 0, shard)
    if module.endswith(_COLUMN_SHARDED) and kind == "weight":
        return _slice(tensor, 1, shard)
    return tensor


def build_shard(
    config: ModelConfig, state: Mapping[str, torch.Tensor], shard: TensorParallelShard, **build_options
):
    """Rank ``shard.rank``'s model: built from its checkpoint slice (read a tensor at a time, as
    ``build_model`` streams), then parallelized. ``build_options``: ``model_builder.build_model``'s
    keywords (backend, device, dtype, on_group)."""
    local = shard_config(config, shard.size)
    state = shard_checkpoint(state, config, shard)
    if shard.expert_parallel:
        local = expert_parallel.shard_config(local, shard.rank, shard.size)
        local_names = [name for name in state if expert_parallel.is_local_tensor(name, local)]
        state = DerivedTensors(local_names, state.__getitem__)
    elif getattr(local, "moe", None) is not None:
        local = sharded_experts.shard_config(local, shard.size)
    model = build_model(replace(local, vocab_size=config.vocab_size // shard.size), state, **build_options)
    parallelize(model, shard)
    model.config = local  # the shard's heads and MLP; the full vocabulary (the logits are gathered)
    return model


def parallelize(model: nn.Module, shard: TensorParallelShard) -> None:
    """Swap a loaded shard's output projections, embedding and LM head for the parallel modules (a
    MoE layer: its experts' intermediate columns split and one all-reduce per layer,
    ``moe.sharded_experts``; or, with ``shard.expert_parallel``, whole experts split across the ranks)."""
    model.untie_lm_head()  # a pipeline stage without the head keeps none (``pipeline_stage``)
    for layer in model.model.layers:
        layer.self_attn.o_proj = RowParallelLinear(layer.self_attn.o_proj, shard.group)
        if isinstance(layer.mlp, SwiGLU):
            layer.mlp.down_proj = RowParallelLinear(layer.mlp.down_proj, shard.group)
    if shard.expert_parallel:
        expert_parallel.parallelize_experts(model, shard.group)
    else:
        for block in [m for m in model.modules() if isinstance(m, SparseMoeBlock)]:
            block.reduce_output = AllReduce(shard.group)
    embed = model.model.embed_tokens
    if embed is not None:  # None: a later pipeline stage
        model.model.embed_tokens = VocabParallelEmbedding(
            embed.weight, shard.rank * embed.weight.shape[0], shard.group
        )
    if model.lm_head is not None:  # None: an earlier pipeline stage
        model.lm_head = VocabParallelLMHead(model.lm_head, shard.size, shard.group)


class RowParallelLinear(nn.Module):
    """``all_reduce(x @ weight_shard.T) + bias``: the rank's input columns, one all-reduce."""

    def __init__(self, linear: nn.Linear, group: Any = None):
        super().__init__()
        self.bias = linear.bias
        linear.bias = None
        self.linear = linear
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        dist.all_reduce(out, group=self.group)
        return out if self.bias is None else out.add_(self.bias)


class AllReduce:
    """``all_reduce(x)`` in place over ``group``: completes a MoE block's partial sums
    (``sharded_experts``)."""

    def __init__(self, group: Any = None):
        self.group = group

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x, group=self.group)
        return x


class VocabParallelEmbedding(nn.Module):
    """The rows ``start:start + len(weight)`` of the embedding table; other ids give zeros, and an
    all-reduce sums the ranks' rows (exactly one rank holds each id)."""

    def __init__(self, weight: nn.Parameter, start: int, group: Any = None):
        super().__init__()
        self.weight = weight
        self.start = start
        self.group = group

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local_ids = input_ids - self.start
        outside = (local_ids < 0) | (local_ids >= self.weight.shape[0])
        out = F.embedding(local_ids.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0)
        dist.all_reduce(out, group=self.group)
        return out


class VocabParallelLMHead(nn.Module):
    """Logits of the rank's vocabulary slice, all-gathered into full-width rows on every rank."""

    def __init__(self, linear: nn.Linear, size: int, group: Any = None):
        super().__init__()
        self.linear = linear
        self.size = size
        self.group = group

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        local = self.linear(hidden).contiguous()
        if local.shape[0] == 0:  # no row is sampled this step (same on every rank: the same batch)
            return local.new_empty((0, local.shape[1] * self.size))
        parts = [torch.empty_like(local) for _ in range(self.size)]
        dist.all_gather(parts, local, group=self.group)
        return torch.cat(parts, dim=-1)


def _slice(tensor: torch.Tensor, dim: int, shard: TensorParallelShard) -> torch.Tensor:
    length = tensor.shape[dim] // shard.size
    return tensor.narrow(dim, shard.rank * length, length).clone()
