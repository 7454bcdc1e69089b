"""The torch paged backend's per-step metadata: index tensors built once from the ``Batch`` and
shared by every layer (``torch_attention``): one group of single-token queries (decodes) attended
together, one segment per multi-token query (prefill), and, for the compiled CPU kernels, every
prefill of the step as the prefill kernel reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hetero_core.engine.batch import Batch, slot_of
from hetero_core.model.cpu.kernel_attention import PrefillSequences


@dataclass(frozen=True)
class DecodeGroup:
    """Single-token queries attended in one padded SDPA call."""

    token_index: torch.Tensor | None  # [num_seqs] flat token rows; None: every token of the step, in order
    block_index: torch.Tensor  # [num_seqs * max_blocks] block tables padded with block 0, flattened
    key_mask: torch.Tensor  # [num_seqs, 1, 1, max_blocks * block_size] bool, True = inside the context
    key_bias: torch.Tensor  # [1, num_seqs, 1, max_blocks * block_size] fp32: 0 inside the context, -inf outside
    context_lens: torch.Tensor  # [num_seqs] int64
    num_seqs: int
    # block_index per KV head into the cache viewed as [num_kv_heads * num_blocks, ...], built by
    # the first layer (it depends on the cache's shape) and reused by the others
    head_block_index: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    def per_head_block_index(self, num_kv_heads: int, num_blocks: int) -> torch.Tensor:
        """``[num_kv_heads * num_seqs * max_blocks]``: every KV head's copy of ``block_index``, offset
        to that head's blocks. One gather along dimension 0 with it is ~1.3x faster than a gather
        along the cache's block dimension."""
        key = (num_kv_heads, num_blocks)
        if key not in self.head_block_index:
            offsets = torch.arange(num_kv_heads, device=self.block_index.device) * num_blocks
            self.head_block_index[key] = (offsets[:, None] + self.block_index[None, :]).flatten()
        return self.head_block_index[key]


@dataclass(frozen=True)
class PrefillSegment:
    """One sequence's multi-token query: flat rows ``start:end``."""

    start: int
    end: int
    context_slots: torch.Tensor | None  # [context_len] cache slots; None: no cached prefix
    mask: torch.Tensor | None  # [query_len, context_len] bool causal mask after the prefix; None: no prefix


@dataclass(frozen=True)
class TorchPagedMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] where each new token's K/V goes
    decode: DecodeGroup | None
    prefills: tuple[PrefillSegment, ...]
    prefill_seqs: PrefillSequences | None = None  # the prefills as the CPU kernel reads them

    @property
    def pure_decode(self) -> bool:
        """True when every token of the step is a decode (one group, in token order)."""
        return self.decode is not None and self.decode.token_index is None


def build_metadata(batch: Batch, device: torch.device, *, for_cpu_kernels: bool) -> TorchPagedMetadata:
    """The step's index tensors on ``device``; ``for_cpu_kernels``: the prefills for the CPU kernel too."""
    _check_block_tables(batch)
    single = [i for i in range(batch.num_seqs) if batch.query_len(i) == 1]
    multi = [i for i in range(batch.num_seqs) if batch.query_len(i) > 1]
    return TorchPagedMetadata(
        slot_mapping=_to(torch.tensor(batch.slot_mapping, dtype=torch.long), device),
        decode=_decode_group(batch, single, whole=not multi, device=device) if single else None,
        prefills=tuple(_prefill_segment(batch, i, device) for i in multi),
        prefill_seqs=_prefill_sequences(batch, multi) if multi and for_cpu_kernels else None,
    )


def _decode_group(batch: Batch, seqs: list[int], whole: bool, device: torch.device) -> DecodeGroup:
    """Index tensors for the single-token sequences ``seqs``; ``whole``: they hold all the step's tokens."""
    tables = _padded_block_tables(batch, seqs)
    context_lens = torch.tensor([batch.context_lens[i] for i in seqs], dtype=torch.long)
    key_mask = torch.arange(tables.shape[1] * batch.block_size)[None, :] < context_lens[:, None]
    key_bias = torch.zeros(key_mask.shape).masked_fill_(~key_mask, float("-inf"))
    token_index = None if whole else torch.tensor([batch.query_start_loc[i] for i in seqs], dtype=torch.long)
    return DecodeGroup(
        token_index=None if token_index is None else _to(token_index, device),
        block_index=_to(tables.flatten(), device),
        key_mask=_to(key_mask[:, None, None, :], device),
        key_bias=_to(key_bias[None, :, None, :], device),
        context_lens=_to(context_lens, device),
        num_seqs=len(seqs),
    )


def _prefill_segment(batch: Batch, i: int, device: torch.device) -> PrefillSegment:
    start, end = batch.query_start_loc[i], batch.query_start_loc[i + 1]
    context_len, num_cached = batch.context_lens[i], batch.num_computed_tokens(i)
    if num_cached == 0:
        return PrefillSegment(start, end, context_slots=None, mask=None)
    key_pos = torch.arange(context_len)
    table = torch.tensor(batch.block_tables[i], dtype=torch.long)
    slots = slot_of(table, key_pos, batch.block_size)
    query_pos = num_cached + torch.arange(end - start)
    mask = key_pos[None, :] <= query_pos[:, None]
    return PrefillSegment(start, end, context_slots=_to(slots, device), mask=_to(mask, device))


def _prefill_sequences(batch: Batch, seqs: list[int]) -> PrefillSequences:
    """The multi-token sequences ``seqs`` for the CPU prefill kernel (always on the CPU)."""
    return PrefillSequences(
        query_start=torch.tensor([batch.query_start_loc[i] for i in seqs], dtype=torch.long),
        query_len=torch.tensor([batch.query_len(i) for i in seqs], dtype=torch.long),
        context_lens=torch.tensor([batch.context_lens[i] for i in seqs], dtype=torch.long),
        block_tables=_padded_block_tables(batch, seqs),
    )


def _padded_block_tables(batch: Batch, seqs: list[int]) -> torch.Tensor:
    """``[len(seqs), max_blocks]`` int64: the block tables of ``seqs``, padded with block 0."""
    max_blocks = max(len(batch.block_tables[i]) for i in seqs)
    return torch.tensor([batch.block_tables[i] + [0] * (max_blocks - len(batch.block_tables[i])) for i in seqs],
                        dtype=torch.long)


def _to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    return tensor.to(device, non_blocking=True)


def _check_block_tables(batch: Batch) -> None:
    for i in range(batch.num_seqs):
        capacity = len(batch.block_tables[i]) * batch.block_size
        if capacity < batch.context_lens[i]:
            raise ValueError(
                f"sequence {batch.seq_ids[i]}: block table holds {capacity} slots but context_len is "
                f"{batch.context_lens[i]}; the allocator must assign enough blocks before execute()"
            )
