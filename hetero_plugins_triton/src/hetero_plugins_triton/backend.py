"""The Triton paged attention backend: core's model code calls it once per layer.

Cache layout ``[num_blocks, block_size, num_kv_heads, head_dim]`` per layer for K and V. Per step
``build_metadata`` sorts the sequences once into

- a decode group (one query token each): split-K flash decoding, the split count chosen for the step;
- a prefill group (several query tokens, possibly after a cached prefix): the varlen causal kernel,

and uploads all their index tensors to the device with the runner's inputs, in one copy from pinned
memory (``hetero_core.model.step_inputs``). ``forward`` stores the step's K/V by slot mapping, then
runs the two kernels, each writing its own rows of the output. A pure decode step can also run from
a CUDA graph (``decode_graph_metadata``): nothing in ``forward`` reads the host or synchronises.

Import this module only after ``kernels.compile.import_triton``.
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
            KVCache(
                torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)
            )
            for _ in range(num_layers)
        ]

    def build_metadata(
        self, batch: Batch, device: torch.device, upload: StepUpload | None = None
    ) -> TritonMetadata:
        """The step's index arrays, added to ``upload`` (the runner's, or a fresh one) and uploaded
        with it: one host-to-device copy for the step."""
        check_block_tables(batch)
        upload = upload if upload is not None else StepInputs(device).begin()
        starts = np.asarray(batch.query_start_loc, dtype=np.int32)
        query_lens = np.diff(starts)
        context_lens = np.asarray(batch.context_lens, dtype=np.int32)
        single = np.flatnonzero(query_lens == 1)
        multi = np.flatnonzero(query_lens > 1)
        slot_mapping = upload.add(batch.slot_mapping, torch.int32)
        if single.size:
            decode = (
                upload.add(starts[single], torch.int32),
                upload.add(context_lens[single], torch.int32),
                _block_tables(batch, single, upload),
            )
            num_splits = choose_num_splits(
                max_context_len=int(context_lens[single].max()),
                num_seqs=len(single),
                num_kv_heads=self.num_kv_heads or 1,
                num_sms=self.settings.num_sms,
                block_n=self.settings.decode_block_n,
                forced=self.settings.num_splits,
            )
        if multi.size:
            prefill = (
                upload.add(starts[multi], torch.int32),
                upload.add(query_lens[multi], torch.int32),
                upload.add(context_lens[multi], torch.int32),
                _block_tables(batch, multi, upload),
            )
        upload.upload()
        return TritonMetadata(
            slot_mapping.tensor,
            DecodePlan(*(staged.tensor for staged in decode), num_splits) if single.size else None,
            PrefillPlan(*(staged.tensor for staged in prefill), int(query_lens[multi].max()))
            if multi.size
            else None,
        )

    def decode_graph_metadata(self, inputs: DecodeGraphInputs) -> TritonMetadata:
        """Metadata over a decode graph's static inputs (``hetero_core.model.decode_graphs``): the
        split count fixed for the graph's batch size at the longest context the model allows (the
        kernel deals each sequence's own tiles to the splits; splits past its context do nothing)."""
        num_splits = choose_num_splits(
            max_context_len=inputs.max_context_len,
            num_seqs=inputs.num_seqs,
            num_kv_heads=self.num_kv_heads or 1,
            num_sms=self.settings.num_sms,
            block_n=self.settings.decode_block_n,
            forced=self.settings.num_splits,
        )
        plan = DecodePlan(inputs.query_rows, inputs.context_lens, inputs.block_tables, num_splits)
        return TritonMetadata(inputs.slot_mapping, plan, None)

    def forward(self, query, key, value, kv_cache: KVCache, metadata: TritonMetadata, scale: float):
        settings = self.settings
        store_kv(
            key, value, kv_cache.key, kv_cache.value, metadata.slot_mapping, interpret=settings.interpret
        )
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        if metadata.decode is not None:
            plan = metadata.decode
            decode_attention(
                query,
                kv_cache.key,
                kv_cache.value,
                plan.block_tables,
                plan.context_lens,
                plan.query_rows,
                out,
                scale=scale,
                num_splits=plan.num_splits,
                block_n=settings.decode_block_n,
                interpret=settings.interpret,
            )
        if metadata.prefill is not None:
            plan = metadata.prefill
            prefill_attention(
                query,
                kv_cache.key,
                kv_cache.value,
                plan.block_tables,
                plan.query_starts,
                plan.query_lens,
                plan.context_lens,
                out,
                max_query_len=plan.max_query_len,
                scale=scale,
                block_m=settings.prefill_block_m,
                block_n=settings.prefill_block_n,
                interpret=settings.interpret,
            )
        return out


def _block_tables(batch: Batch, seqs: np.ndarray, upload: StepUpload) -> Staged:
    """``[len(seqs), max_blocks]`` int32: the block tables of ``seqs``, padded with block 0."""
    tables = (
        batch.block_tables if len(seqs) == batch.num_seqs else [batch.block_tables[i] for i in seqs.tolist()]
    )
    staged = upload.zeros((len(tables), max(map(len, tables))), torch.int32)
    fill_block_tables(staged.host, tables)
    return staged
