"""MLA's projections (Hugging Face's names): the query path, the compressed latent, and the backend
call that caches the latent and attends (``forward_latent``, see ``model/cpu/torch_mla_attention``).
The query's first projection and the latent's run as one matmul, ``q_kv_a_proj`` (both read the
hidden state; ``mla.weights`` concatenates them from the checkpoint, ``fused_a_parts``).

Per token this layer hands the backend ``[c_kv, k_pe]``: the normed latent (``kv_lora_rank``) and
the rotated RoPE key (``qk_rope_head_dim``), shared by every head. ``kv_b_proj`` stays a plain
weight (not an ``nn.Linear``): the backend reads it whole (decompression for prefill; its key and
value halves, W_UK and W_UV, for the absorbed decode), so linear packing leaves it alone.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

from hetero_core.model.attention import KVCache
from hetero_core.model.layers import RMSNorm
from hetero_core.model.mla.config import MLAConfig
from hetero_core.model.mla.rope import apply_rotary, softmax_scale


def fused_a_parts(config: MLAConfig) -> tuple[tuple[str, int], ...] | None:
    """``q_kv_a_proj``'s checkpoint projections and their output rows, in order: ``q_a_proj`` (or
    ``q_proj`` without q compression) then ``kv_a_proj_with_mqa``; None where they stay apart
    (no q compression and attention biases: ``q_proj`` has none, the latent's projection has one)."""
    latent = ("kv_a_proj_with_mqa", config.kv_lora_rank + config.qk_rope_head_dim)
    if config.q_lora_rank is not None:
        return (("q_a_proj", config.q_lora_rank), latent)
    if config.attention_bias:
        return None
    return (("q_proj", config.num_attention_heads * config.qk_head_dim), latent)


class LatentWeights(NamedTuple):
    """``kv_b_proj`` as the backend reads it: ``weight`` [heads * (nope + v), rank] (decompression),
    ``w_uk`` [heads, nope, rank] (absorbed into the query) and ``w_uv_t`` [heads, rank, v] (applied to
    the attended latent), both contiguous."""

    weight: torch.Tensor
    w_uk: torch.Tensor
    w_uv_t: torch.Tensor


class LatentProjection(nn.Module):
    """``kv_b_proj``: weight ``[heads * (qk_nope + v), kv_lora_rank]``, read by the attention backend;
    ``split()``: its absorbed halves, made once per weight tensor (not per step)."""

    def __init__(self, rank: int, out_features: int, num_heads: int, nope_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, rank))
        self.num_heads, self.nope_dim = num_heads, nope_dim
        self._split: tuple[torch.Tensor, LatentWeights] | None = None

    def split(self) -> LatentWeights:
        weight = self.weight
        if self._split is None or self._split[0] is not weight:  # built, or reassigned since (loading, .to)
            per_head = weight.detach().view(self.num_heads, -1, weight.shape[-1])
            halves = LatentWeights(
                weight,
                per_head[:, : self.nope_dim].contiguous(),
                per_head[:, self.nope_dim :].transpose(1, 2).contiguous(),
            )
            self._split = (weight, halves)
        return self._split[1]


class MLAAttention(nn.Module):
    def __init__(self, config: MLAConfig, backend: Any):
        super().__init__()
        self.backend = backend
        self.num_heads = config.num_attention_heads
        self.nope_dim, self.rope_dim, self.v_dim = (
            config.qk_nope_head_dim,
            config.qk_rope_head_dim,
            config.v_head_dim,
        )
        self.rank = config.kv_lora_rank
        self.interleave = config.rope_interleave
        self.scale = softmax_scale(config)
        hidden, q_size = config.hidden_size, self.num_heads * config.qk_head_dim
        bias = config.attention_bias
        parts = fused_a_parts(config)
        if parts is not None:  # the query's first projection and the latent's, as one matmul
            self.q_width = parts[0][1]
            self.q_kv_a_proj = nn.Linear(hidden, sum(rows for _, rows in parts), bias=bias)
        else:  # q_proj has no bias where the latent's projection has one: two matmuls
            self.q_kv_a_proj = None
            self.q_proj = nn.Linear(hidden, q_size, bias=False)
            self.kv_a_proj_with_mqa = nn.Linear(hidden, self.rank + self.rope_dim, bias=bias)
        if config.q_lora_rank is None:
            self.q_a_layernorm = self.q_b_proj = None
        else:
            self.q_a_layernorm = RMSNorm(config.q_lora_rank, 1e-6)  # HF's default eps for these norms
            self.q_b_proj = nn.Linear(config.q_lora_rank, q_size, bias=False)
        self.kv_a_layernorm = RMSNorm(self.rank, 1e-6)
        self.kv_b_proj = LatentProjection(
            self.rank, self.num_heads * (self.nope_dim + self.v_dim), self.num_heads, self.nope_dim
        )
        self.o_proj = nn.Linear(self.num_heads * self.v_dim, hidden, bias=bias)

    def forward(
        self, hidden, cos, sin, kv_cache: KVCache, attn_metadata: Any, output_rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        if self.q_kv_a_proj is not None:
            fused = self.q_kv_a_proj(hidden)
            q, compressed = fused[:, : self.q_width], fused[:, self.q_width :]
        else:
            q, compressed = self.q_proj(hidden), self.kv_a_proj_with_mqa(hidden)
        if self.q_b_proj is not None:
            q = self.q_b_proj(self.q_a_layernorm(q.contiguous()))
        q = q.view(num_tokens, self.num_heads, self.nope_dim + self.rope_dim)
        q_pe = apply_rotary(q[..., self.nope_dim :], cos, sin, self.interleave)
        c_kv = self.kv_a_layernorm(compressed[:, : self.rank].contiguous())
        k_pe = apply_rotary(compressed[:, None, self.rank :], cos, sin, self.interleave)[:, 0]
        latent = torch.cat([c_kv, k_pe], dim=-1)  # what the cache stores for this token
        out = self.backend.forward_latent(
            q[..., : self.nope_dim], q_pe, latent, kv_cache, attn_metadata, self.scale, self.kv_b_proj.split()
        )
        out = out.reshape(num_tokens, self.num_heads * self.v_dim)
        return self.o_proj(out if output_rows is None else out[output_rows])
