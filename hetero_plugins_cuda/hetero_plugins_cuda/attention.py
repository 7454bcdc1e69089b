"""The flash-attn attention backend: paged KV cache, varlen prefill, paged decode.

Cache layout per layer (flash-attn's paged layout): K and V each
``[num_blocks, block_size, num_kv_heads, head_dim]``. Each layer first writes the step's new K/V
at ``slot_mapping`` (one ``index_copy_`` into the flattened cache), then attends:

- a pure decode step (every sequence has one query token) calls ``flash_attn_with_kvcache`` with
  ``block_table`` [num_seqs, max_blocks] and ``cache_seqlens`` (the context lengths, the new token
  included since it is already written); the tensors have fixed shapes, so the step can be
  captured in a CUDA graph;
- any other step calls ``flash_attn_varlen_func`` once over all its sequences (decode rows are
  one-token segments): with the new K/V directly when no sequence has cached tokens, else with the
  cache and ``block_table`` (a prefill continuing a cached prefix, or decodes beside prefills);
  flash-attn aligns the causal mask to the end of each key range, as a continued prefill needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hetero_core.executor import Batch
from hetero_core.model.attention import KVCache
from hetero_plugins_cuda.kernels import FlashAttnKernels


@dataclass(frozen=True)
class DecodeMetadata:
    block_table: torch.Tensor  # int32 [num_seqs, max_blocks]
    cache_seqlens: torch.Tensor  # int32 [num_seqs] tokens in the cache, this step's included


@dataclass(frozen=True)
class PrefillMetadata:
    cu_seqlens_q: torch.Tensor  # int32 [num_seqs + 1] query offsets into the flat tokens
    cu_seqlens_k: torch.Tensor  # int32 [num_seqs + 1] key offsets (context lengths, cumulated)
    max_seqlen_q: int
    max_seqlen_k: int
    block_table: torch.Tensor | None  # int32 [num_seqs, max_blocks]; None: attend the new K/V only


@dataclass(frozen=True)
class FlashAttnMetadata:
    slot_mapping: torch.Tensor  # int64 [num_tokens] where each new token's K/V goes
    decode: DecodeMetadata | None
    prefill: PrefillMetadata | None


class FlashAttnBackend:
    """Implements ``hetero_core.model.attention.AttentionBackend`` with flash-attn's kernels."""

    name = "flash_attn"

    def __init__(self, kernels: FlashAttnKernels):
        self.kernels = kernels

    def allocate_kv_cache(self, num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, device):
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        return [
            KVCache(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(num_layers)
        ]

    def build_metadata(self, batch: Batch, device: torch.device) -> FlashAttnMetadata:
        check_block_tables(batch)
        slot_mapping = _to(torch.tensor(batch.slot_mapping, dtype=torch.long), device)
        if all(batch.query_len(i) == 1 for i in range(batch.num_seqs)):
            decode = DecodeMetadata(
                block_table=_to(block_table_tensor(batch.block_tables), device),
                cache_seqlens=_to(torch.tensor(batch.context_lens, dtype=torch.int32), device),
            )
            return FlashAttnMetadata(slot_mapping, decode=decode, prefill=None)
        is_fresh = all(batch.num_computed_tokens(i) == 0 for i in range(batch.num_seqs))
        cu_seqlens_k = [0]
        for length in batch.context_lens:
            cu_seqlens_k.append(cu_seqlens_k[-1] + length)
        prefill = PrefillMetadata(
            cu_seqlens_q=_to(torch.tensor(batch.query_start_loc, dtype=torch.int32), device),
            cu_seqlens_k=_to(torch.tensor(cu_seqlens_k, dtype=torch.int32), device),
            max_seqlen_q=max(batch.query_len(i) for i in range(batch.num_seqs)),
            max_seqlen_k=max(batch.context_lens),
            block_table=None if is_fresh else _to(block_table_tensor(batch.block_tables), device),
        )
        return FlashAttnMetadata(slot_mapping, decode=None, prefill=prefill)

    def forward(self, query, key, value, kv_cache: KVCache, metadata: FlashAttnMetadata, scale: float):
        write_kv(kv_cache, key, value, metadata.slot_mapping)
        decode = metadata.decode
        if decode is not None:
            out = self.kernels.with_kvcache(
                query.unsqueeze(1),
                kv_cache.key,
                kv_cache.value,
                cache_seqlens=decode.cache_seqlens,
                block_table=decode.block_table,
                softmax_scale=scale,
                causal=True,
            )
            return out.view(query.shape)
        prefill = metadata.prefill
        if prefill.block_table is None:  # fresh prompts: their keys are exactly the new K/V
            return self.kernels.varlen(
                query, key, value, prefill.cu_seqlens_q, prefill.cu_seqlens_q,
                prefill.max_seqlen_q, prefill.max_seqlen_q, softmax_scale=scale, causal=True,
            )  # fmt: skip
        return self.kernels.varlen(
            query, kv_cache.key, kv_cache.value, prefill.cu_seqlens_q, prefill.cu_seqlens_k,
            prefill.max_seqlen_q, prefill.max_seqlen_k, softmax_scale=scale, causal=True,
            block_table=prefill.block_table,
        )  # fmt: skip


def write_kv(kv_cache: KVCache, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store each token's K/V ``[num_tokens, num_kv_heads, head_dim]`` at its cache slot."""
    num_kv_heads, head_dim = kv_cache.key.shape[-2:]
    kv_cache.key.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)
    kv_cache.value.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)


def block_table_tensor(tables: list[list[int]], width: int | None = None) -> torch.Tensor:
    """int32 ``[len(tables), width]`` (default: the longest table), padded with block 0, which
    flash-attn never reads past a sequence's length."""
    width = width if width is not None else max(len(t) for t in tables)
    return torch.tensor([table + [0] * (width - len(table)) for table in tables], dtype=torch.int32)


def check_block_tables(batch: Batch) -> None:
    for i in range(batch.num_seqs):
        capacity = len(batch.block_tables[i]) * batch.block_size
        if capacity < batch.context_lens[i]:
            raise ValueError(
                f"sequence {batch.seq_ids[i]}: block table holds {capacity} slots but context_len is "
                f"{batch.context_lens[i]}; the allocator must assign enough blocks before execute()"
            )


def _to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    return tensor.to(device, non_blocking=True)
