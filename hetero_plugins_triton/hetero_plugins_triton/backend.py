"""The Triton paged attention backend: core's model code calls it once per layer.

Same cache layout as the torch reference (``[num_blocks, block_size, num_kv_heads, head_dim]`` per
layer for K and V). Per step ``build_metadata`` sorts the sequences once into

- a decode group (one query token each): split-K flash decoding, the split count chosen for the step;
- a prefill group (several query tokens, possibly after a cached prefix): the varlen causal kernel,

and uploads all their index tensors to the device in one copy. ``forward`` stores the step's K/V by
slot mapping, then runs the two kernels, each writing its own rows of the output.

Import this module only after ``kernels.compile.import_triton``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hetero_core.executor import Batch
from hetero_core.model.attention import KVCache
from hetero_plugins_triton.kernels.decode_attention import decode_attention
from hetero_plugins_triton.kernels.kv_store import store_kv
from hetero_plugins_triton.kernels.prefill_attention import prefill_attention
from hetero_plugins_triton.splits import choose_num_splits


@dataclass(frozen=True)
class KernelSettings:
    interpret: bool
    num_sms: int  # the device's streaming multiprocessors (1 for the interpreter)
    num_splits: int | None  # forced decode splits, or None to choose per step
    decode_block_n: int = 64
    prefill_block_m: int = 64
    prefill_block_n: int = 64


@dataclass(frozen=True)
class DecodePlan:
    query_rows: torch.Tensor  # [n] int32 flat row of each sequence's query token
    context_lens: torch.Tensor  # [n] int32
    block_tables: torch.Tensor  # [n, max_blocks] int32, padded with block 0
    num_splits: int


@dataclass(frozen=True)
class PrefillPlan:
    query_starts: torch.Tensor  # [n] int32 first flat row of each sequence
    query_lens: torch.Tensor  # [n] int32
    context_lens: torch.Tensor  # [n] int32
    block_tables: torch.Tensor  # [n, max_blocks] int32, padded with block 0
    max_query_len: int


@dataclass(frozen=True)
class TritonMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int32
    decode: DecodePlan | None
    prefill: PrefillPlan | None


class TritonPagedAttention:
    name = "triton_paged"

    def __init__(self, settings: KernelSettings):
        self.settings = settings
        self.num_kv_heads: int | None = None

    def allocate_kv_cache(self, num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, device):
        self.num_kv_heads = num_kv_heads
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        return [
            KVCache(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(num_layers)
        ]

    def build_metadata(self, batch: Batch, device: torch.device) -> TritonMetadata:
        _check_block_tables(batch)
        single = [i for i in range(batch.num_seqs) if batch.query_len(i) == 1]
        multi = [i for i in range(batch.num_seqs) if batch.query_len(i) > 1]
        parts = [torch.tensor(batch.slot_mapping, dtype=torch.int32)]
        if single:
            parts += [_column([batch.query_start_loc[i] for i in single]),
                      _column([batch.context_lens[i] for i in single]), _block_tables(batch, single)]
        if multi:
            parts += [_column([batch.query_start_loc[i] for i in multi]),
                      _column([batch.query_len(i) for i in multi]),
                      _column([batch.context_lens[i] for i in multi]), _block_tables(batch, multi)]
        uploaded = iter(_upload(parts, device))
        slot_mapping = next(uploaded)
        decode = prefill = None
        if single:
            num_splits = choose_num_splits(
                max_context_len=max(batch.context_lens[i] for i in single), num_seqs=len(single),
                num_kv_heads=self.num_kv_heads or 1, num_sms=self.settings.num_sms,
                block_n=self.settings.decode_block_n, forced=self.settings.num_splits,
            )
            decode = DecodePlan(next(uploaded), next(uploaded), next(uploaded), num_splits)
        if multi:
            max_query_len = max(batch.query_len(i) for i in multi)
            prefill = PrefillPlan(next(uploaded), next(uploaded), next(uploaded), next(uploaded), max_query_len)
        return TritonMetadata(slot_mapping, decode, prefill)

    def forward(self, query, key, value, kv_cache: KVCache, metadata: TritonMetadata, scale: float):
        settings = self.settings
        store_kv(key, value, kv_cache.key, kv_cache.value, metadata.slot_mapping, interpret=settings.interpret)
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        if metadata.decode is not None:
            plan = metadata.decode
            decode_attention(query, kv_cache.key, kv_cache.value, plan.block_tables, plan.context_lens,
                             plan.query_rows, out, scale=scale, num_splits=plan.num_splits,
                             block_n=settings.decode_block_n, interpret=settings.interpret)
        if metadata.prefill is not None:
            plan = metadata.prefill
            prefill_attention(query, kv_cache.key, kv_cache.value, plan.block_tables, plan.query_starts,
                              plan.query_lens, plan.context_lens, out, max_query_len=plan.max_query_len,
                              scale=scale, block_m=settings.prefill_block_m, block_n=settings.prefill_block_n,
                              interpret=settings.interpret)
        return out


def _column(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _block_tables(batch: Batch, seqs: list[int]) -> torch.Tensor:
    max_blocks = max(len(batch.block_tables[i]) for i in seqs)
    return torch.tensor([batch.block_tables[i] + [0] * (max_blocks - len(batch.block_tables[i])) for i in seqs],
                        dtype=torch.int32)


def _upload(parts: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """All ``parts`` (int32) on ``device`` in one host-to-device copy, as views of one buffer."""
    flat = torch.cat([part.flatten() for part in parts]).to(device, non_blocking=True)
    views, offset = [], 0
    for part in parts:
        views.append(flat[offset:offset + part.numel()].view(part.shape))
        offset += part.numel()
    return views


def _check_block_tables(batch: Batch) -> None:
    for i in range(batch.num_seqs):
        capacity = len(batch.block_tables[i]) * batch.block_size
        if capacity < batch.context_lens[i]:
            raise ValueError(
                f"sequence {batch.seq_ids[i]}: block table holds {capacity} slots but context_len is "
                f"{batch.context_lens[i]}; the allocator must assign enough blocks before execute()"
            )
