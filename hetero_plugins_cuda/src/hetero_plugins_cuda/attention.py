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

The step's index arrays go to the device with the runner's in one copy from pinned memory
(``hetero_core.model.step_inputs``); a pure decode step can run from a CUDA graph over static
inputs instead (``decode_graph_metadata``, ``hetero_core.model.decode_graphs``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hetero_core.executor import Batch
from hetero_core.model.attention import KVCache
from hetero_core.model.decode_graphs import DecodeGraphInputs
from hetero_core.model.step_inputs import (
    Staged,
    StepInputs,
    StepUpload,
    check_block_tables,
    fill_block_tables,
)
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
            KVCache(
                torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)
            )
            for _ in range(num_layers)
        ]

    def build_metadata(
        self, batch: Batch, device: torch.device, upload: StepUpload | None = None
    ) -> FlashAttnMetadata:
        """The step's index arrays, added to ``upload`` (the runner's, or a fresh one) and uploaded
        with it: one host-to-device copy for the step."""
        check_block_tables(batch)
        upload = upload if upload is not None else StepInputs(device).begin()
        slot_mapping = upload.add(batch.slot_mapping, torch.long)
        starts = np.asarray(batch.query_start_loc, dtype=np.int32)
        query_lens = np.diff(starts)
        if (query_lens == 1).all():
            tables = _block_tables(batch.block_tables, upload)
            cache_seqlens = upload.add(batch.context_lens, torch.int32)
            upload.upload()
            decode = DecodeMetadata(block_table=tables.tensor, cache_seqlens=cache_seqlens.tensor)
            return FlashAttnMetadata(slot_mapping.tensor, decode=decode, prefill=None)
        context_lens = np.asarray(batch.context_lens, dtype=np.int32)
        is_fresh = bool((context_lens == query_lens).all())
        cu_seqlens_q = upload.add(starts, torch.int32)
        cu_seqlens_k = upload.add(np.concatenate(([0], np.cumsum(context_lens))), torch.int32)
        tables = None if is_fresh else _block_tables(batch.block_tables, upload)
        upload.upload()
        prefill = PrefillMetadata(
            cu_seqlens_q=cu_seqlens_q.tensor,
            cu_seqlens_k=cu_seqlens_k.tensor,
            max_seqlen_q=int(query_lens.max()),
            max_seqlen_k=int(context_lens.max()),
            block_table=None if tables is None else tables.tensor,
        )
        return FlashAttnMetadata(slot_mapping.tensor, decode=None, prefill=prefill)

    def decode_graph_metadata(self, inputs: DecodeGraphInputs) -> FlashAttnMetadata:
        """Metadata over a decode graph's static inputs (``hetero_core.model.decode_graphs``)."""
        decode = DecodeMetadata(block_table=inputs.block_tables, cache_seqlens=inputs.context_lens)
        return FlashAttnMetadata(inputs.slot_mapping, decode=decode, prefill=None)

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


def _block_tables(tables: list[list[int]], upload: StepUpload) -> Staged:
    """int32 ``[len(tables), longest]``, padded with block 0, which flash-attn never reads past a
    sequence's length."""
    staged = upload.zeros((len(tables), max(map(len, tables))), torch.int32)
    fill_block_tables(staged.host, tables)
    return staged
