"""The torch paged attention backend: pure PyTorch, any device, the reference for other backends.

Per step, sequences are split into at most two groups: single-token queries (decode, or a
one-token prefill chunk) and longer queries (prefill, possibly continuing a cached prefix). Each
group gets index tensors built once per step: where its tokens sit in a ``[num_seqs,
max_query_len]`` padding, which cache slots hold each sequence's context (through its block
table), and a mask (causal with the cached-prefix offset, and key < context_len). Per layer, each
group is one gather + one ``scaled_dot_product_attention`` call: no Python loop over sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from hetero_core.engine.batch import Batch
from hetero_core.model.attention import KVCache


@dataclass(frozen=True)
class AttentionGroup:
    """Sequences attended together in one padded SDPA call."""

    token_index: torch.Tensor | None  # [group_tokens] flat token indices; None: all tokens, in order
    padded_index: torch.Tensor | None  # [group_tokens] row in the [num_seqs * max_query_len] padding
    context_slots: torch.Tensor  # [num_seqs, max_context_len] cache slot of each context position
    mask: torch.Tensor  # [num_seqs, 1, max_query_len, max_context_len] bool, True = attend
    num_seqs: int
    max_query_len: int


@dataclass(frozen=True)
class TorchPagedMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] where each new token's K/V goes
    groups: tuple[AttentionGroup, ...]


class TorchPagedAttention:
    """Paged KV cache ``[num_blocks, block_size, num_kv_heads, head_dim]`` per layer, SDPA math."""

    name = "torch_paged"

    def allocate_kv_cache(self, num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, device):
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        return [
            KVCache(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(num_layers)
        ]

    def build_metadata(self, batch: Batch, device: torch.device) -> TorchPagedMetadata:
        _check_block_tables(batch)
        single = [i for i in range(batch.num_seqs) if batch.query_len(i) == 1]
        multi = [i for i in range(batch.num_seqs) if batch.query_len(i) > 1]
        whole = len(single) == batch.num_seqs or len(multi) == batch.num_seqs
        groups = tuple(_build_group(batch, seqs, whole) for seqs in (single, multi) if seqs)
        slot_mapping = torch.tensor(batch.slot_mapping, dtype=torch.long)
        return TorchPagedMetadata(
            slot_mapping=slot_mapping.to(device),
            groups=tuple(_group_to(group, device) for group in groups),
        )

    def forward(self, query, key, value, kv_cache: KVCache, metadata: TorchPagedMetadata, scale: float):
        num_kv_heads, head_dim = kv_cache.key.shape[-2:]
        key_slots = kv_cache.key.view(-1, num_kv_heads, head_dim)
        value_slots = kv_cache.value.view(-1, num_kv_heads, head_dim)
        key_slots.index_copy_(0, metadata.slot_mapping, key)
        value_slots.index_copy_(0, metadata.slot_mapping, value)

        if len(metadata.groups) == 1 and metadata.groups[0].token_index is None:
            return _attend(query, key_slots, value_slots, metadata.groups[0], scale)
        out = torch.empty_like(query)
        for group in metadata.groups:  # at most two: single-token and multi-token queries
            out[group.token_index] = _attend(query[group.token_index], key_slots, value_slots, group, scale)
        return out


def _attend(query, key_slots, value_slots, group: AttentionGroup, scale: float) -> torch.Tensor:
    num_heads, head_dim = query.shape[1:]
    rows = group.num_seqs * group.max_query_len
    if group.padded_index is None:
        padded = query
    else:
        padded = query.new_zeros(rows, num_heads, head_dim)
        padded[group.padded_index] = query
    q = padded.view(group.num_seqs, group.max_query_len, num_heads, head_dim).transpose(1, 2)
    k = key_slots[group.context_slots].transpose(1, 2)  # [seqs, kv_heads, ctx, head_dim]
    v = value_slots[group.context_slots].transpose(1, 2)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=group.mask, scale=scale, enable_gqa=k.shape[1] != num_heads
    )
    out = out.transpose(1, 2).reshape(rows, num_heads, head_dim)
    return out if group.padded_index is None else out[group.padded_index]


def _build_group(batch: Batch, seqs: list[int], whole: bool) -> AttentionGroup:
    """Index tensors (on CPU) for the sequences ``seqs``; ``whole``: they hold every token."""
    query_lens = torch.tensor([batch.query_len(i) for i in seqs], dtype=torch.long)
    context_lens = torch.tensor([batch.context_lens[i] for i in seqs], dtype=torch.long)
    starts = torch.tensor([batch.query_start_loc[i] for i in seqs], dtype=torch.long)
    num_seqs, max_query_len = len(seqs), int(query_lens.max())
    max_context_len = int(context_lens.max())

    seq_of_token = torch.repeat_interleave(torch.arange(num_seqs), query_lens)
    group_starts = torch.cumsum(query_lens, 0) - query_lens
    offset = torch.arange(int(query_lens.sum())) - group_starts[seq_of_token]
    token_index = None if whole else starts[seq_of_token] + offset
    padded_index = None if max_query_len == 1 else seq_of_token * max_query_len + offset

    max_blocks = max(len(batch.block_tables[i]) for i in seqs)
    tables = torch.tensor([batch.block_tables[i] + [0] * (max_blocks - len(batch.block_tables[i])) for i in seqs])
    key_pos = torch.arange(max_context_len)
    slots = tables[:, key_pos // batch.block_size] * batch.block_size + key_pos % batch.block_size
    in_context = key_pos[None, :] < context_lens[:, None]
    context_slots = torch.where(in_context, slots, 0)

    query_pos = (context_lens - query_lens)[:, None] + torch.arange(max_query_len)[None, :]
    mask = (key_pos[None, None, :] <= query_pos[:, :, None]) & in_context[:, None, :]
    return AttentionGroup(token_index, padded_index, context_slots, mask[:, None], num_seqs, max_query_len)


def _group_to(group: AttentionGroup, device: torch.device) -> AttentionGroup:
    def move(t):
        return None if t is None else t.to(device, non_blocking=True)

    return AttentionGroup(
        move(group.token_index), move(group.padded_index), move(group.context_slots), move(group.mask),
        group.num_seqs, group.max_query_len,
    )


def _check_block_tables(batch: Batch) -> None:
    for i in range(batch.num_seqs):
        capacity = len(batch.block_tables[i]) * batch.block_size
        if capacity < batch.context_lens[i]:
            raise ValueError(
                f"sequence {batch.seq_ids[i]}: block table holds {capacity} slots but context_len is "
                f"{batch.context_lens[i]}; the allocator must assign enough blocks before execute()"
            )
