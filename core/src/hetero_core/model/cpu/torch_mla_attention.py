"""Multi-head latent attention (MLA, DeepSeek-V2/V3) over the torch backend's paged cache.

A layer's cache is one tensor ``[1, num_blocks, block_size, kv_lora_rank + rope_dim]``: per token
the compressed latent ``c_kv`` and the RoPE key ``k_pe`` shared by every head (no per-head K/V, no V
at all: V is read from the latent). The step's metadata is the torch backend's own
(``torch_attention_metadata``): the same decode group and prefill segments as for MHA.

- Decode (single-token queries) runs the absorbed form: ``q_nope`` is multiplied by W_UK (the key
  half of ``kv_b_proj``, per head) into the latent space, so every head attends the gathered latent
  directly, as multi-query attention with K = ``[c_kv, k_pe]`` and V = ``c_kv``; W_UV (the value
  half) turns the attended latent into the head's output afterwards. No per-head K/V is built.
- Prefill (multi-token queries) decompresses the sequence's latent (new, or gathered from the cache
  for a cached prefix) through ``kv_b_proj`` into per-head K/V and runs causal SDPA, as Hugging Face
  does: for a prompt the per-token work of the absorbed form (rank 512 vs 128 per head) costs more.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from hetero_core.model.cpu.torch_attention_metadata import DecodeGroup, TorchPagedMetadata
from hetero_core.model.mla.attention import LatentWeights


def forward_latent(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    latent: torch.Tensor,
    cache: torch.Tensor,
    metadata: TorchPagedMetadata,
    scale: float,
    weights: LatentWeights,
) -> torch.Tensor:
    """Write the new tokens' ``latent`` [num_tokens, rank + rope] at the metadata's slots, attend.

    ``q_nope`` [num_tokens, heads, nope] and ``q_pe`` [num_tokens, heads, rope] (rotated);
    ``weights``: ``kv_b_proj`` whole and as W_UK / W_UV. Returns [num_tokens, heads, v_head_dim]."""
    width = cache.shape[-1]
    slots = cache.view(-1, width)
    slots.index_copy_(0, metadata.slot_mapping, latent)
    num_tokens, num_heads, _ = q_nope.shape
    decode = metadata.decode
    if metadata.pure_decode:
        return _attend_decode(q_nope, q_pe, cache, decode, scale, weights)
    out = q_nope.new_empty(num_tokens, num_heads, weights.w_uv_t.shape[-1])
    if decode is not None:
        index = decode.token_index
        out.index_copy_(0, index, _attend_decode(q_nope[index], q_pe[index], cache, decode, scale, weights))
    for segment in metadata.prefills:
        rows = slice(segment.start, segment.end)
        context = (
            latent[rows] if segment.context_slots is None else slots.index_select(0, segment.context_slots)
        )
        out[rows] = _attend_prefill(q_nope[rows], q_pe[rows], context, segment.mask, scale, weights.weight)
    return out


def _attend_decode(
    q_nope, q_pe, cache: torch.Tensor, group: DecodeGroup, scale: float, weights: LatentWeights
):
    """The absorbed form over each sequence's gathered latent: [seqs, heads, v_head_dim]."""
    num_seqs = q_nope.shape[0]
    rank = weights.w_uk.shape[-1]
    # [seqs, context, rank + rope]: whole blocks of the padded block tables (masked by key_bias)
    context = cache[0].index_select(0, group.block_index).view(num_seqs, -1, cache.shape[-1])
    q_latent = torch.bmm(q_nope.transpose(0, 1), weights.w_uk).transpose(0, 1)  # [seqs, heads, rank]
    query = torch.cat([q_latent, q_pe], dim=-1)  # [seqs, heads, rank + rope]
    scores = torch.bmm(query, context.transpose(1, 2))  # [seqs, heads, context]
    scores = torch.add(group.key_bias[0], scores, alpha=scale)  # fp32, -inf past each context
    probs = torch.softmax(scores, dim=-1).to(query.dtype)
    attended = torch.bmm(probs, context[..., :rank])  # [seqs, heads, rank]: V is the latent itself
    return torch.bmm(attended.transpose(0, 1), weights.w_uv_t).transpose(0, 1)  # [seqs, heads, v]


def _attend_prefill(
    q_nope, q_pe, context: torch.Tensor, mask: torch.Tensor | None, scale: float, kv_b_weight: torch.Tensor
) -> torch.Tensor:
    """One sequence, its latent decompressed into per-head K/V: [query_len, heads, v_head_dim]."""
    num_heads = q_nope.shape[1]
    rank = kv_b_weight.shape[-1]
    kv = F.linear(context[:, :rank], kv_b_weight).view(context.shape[0], num_heads, -1)
    nope = q_nope.shape[-1]
    k_nope, value = kv[..., :nope], kv[..., nope:]
    k_pe = context[:, None, rank:].expand(-1, num_heads, -1)
    key = torch.cat([k_nope, k_pe], dim=-1)
    query = torch.cat([q_nope, q_pe], dim=-1)
    out = F.scaled_dot_product_attention(
        query.transpose(0, 1)[None],
        key.transpose(0, 1)[None],
        value.transpose(0, 1)[None],
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
    )
    return out[0].transpose(0, 1)
