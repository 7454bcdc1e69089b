"""The compiled kernels' attention calls (``csrc/paged_kv_write.c``, ``paged_decode_attention.c``,
``paged_prefill_attention.c``), as methods of ``kernels.CpuKernels``: new K/V written into their
slots, single-token queries and every multi-token query of a step attended straight on the
head-major block-table cache ``[num_kv_heads, num_blocks, block_size, head_dim]``.

Both attention kernels compute a query row with the same arithmetic (``attention_math.h``), so a
token gets the same bits from either. Every call takes any number of tokens or sequences (none
too) and checks its shapes: a ValueError names what does not fit (the C side checks again and
returns -1).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cached_property

import torch

from hetero_core.model.cpu.kernel_linears import DTYPE_SUFFIXES, check_status, pointer

MAX_HEAD_DIM, MAX_GROUP = 512, 64  # the kernels' fixed limits (paged_decode_attention.c)
LANES = 16  # attention's head sizes are multiples of this (of every ISA's LANES in kernel_math.h)
DECODE_ATTENTION_REFUSED = (
    "the CPU decode-attention kernel refused its inputs (a context beyond its block "
    "table, a block or slot outside the cache)"
)


@dataclass(frozen=True)
class PrefillSequences:
    """The multi-token queries of a step, as the prefill kernel reads them (int64 tensors)."""

    query_start: torch.Tensor  # [num_seqs] each sequence's first row in the flat batch
    query_len: torch.Tensor  # [num_seqs] its rows (new tokens)
    context_lens: torch.Tensor  # [num_seqs] its tokens in the cache after this step's write
    block_tables: torch.Tensor  # [num_seqs, max_blocks] padded

    def __post_init__(self) -> None:
        num_seqs = len(self.query_len)
        for name in ("query_start", "query_len", "context_lens"):
            _check_index("PrefillSequences", name, getattr(self, name), (num_seqs,))
        _check_index(
            "PrefillSequences", "block_tables", self.block_tables, (num_seqs, self.block_tables.shape[-1])
        )

    @cached_property
    def num_rows(self) -> int:
        """The query rows the sequences reach (their last row + 1)."""
        return int((self.query_start + self.query_len).max()) if len(self.query_len) else 0


class AttentionKernels:
    """Mixed into ``CpuKernels`` (which holds ``library``)."""

    library: ctypes.CDLL

    def supports(self, query: torch.Tensor, num_kv_heads: int) -> bool:
        """True for a CPU query of a dtype, head size and group size the attention kernels handle."""
        num_heads, head_dim = query.shape[1:]
        return (
            query.device.type == "cpu"
            and query.dtype in DTYPE_SUFFIXES
            and 0 < head_dim <= MAX_HEAD_DIM
            and head_dim % LANES == 0
            and num_kv_heads > 0
            and num_heads % num_kv_heads == 0
            and num_heads // num_kv_heads <= MAX_GROUP
        )

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slots: torch.Tensor,
    ) -> None:
        """``key``/``value`` [num_tokens, num_kv_heads, head_dim] (rows may be strided, heads and dims
        contiguous) into caches [num_kv_heads, num_blocks, block_size, head_dim] at ``slots`` [num_tokens]
        int64 (``block * block_size + offset``)."""
        num_tokens, num_kv_heads, head_dim = key.shape
        _check_cache("write_kv", key_cache, value_cache, key.dtype, num_kv_heads, head_dim)
        if value.shape != key.shape or value.dtype != key.dtype:
            raise ValueError(f"write_kv: value {tuple(value.shape)} does not match key {tuple(key.shape)}")
        _check_index("write_kv", "slots", slots, (num_tokens,))
        key, value = _rows_strided(key), _rows_strided(value)
        slots_per_head = key_cache.shape[1] * key_cache.shape[2]
        status = self.library.paged_kv_write(
            key.data_ptr(),
            key.stride(0),
            value.data_ptr(),
            value.stride(0),
            key_cache.data_ptr(),
            value_cache.data_ptr(),
            slots.data_ptr(),
            num_tokens,
            num_kv_heads,
            head_dim,
            slots_per_head,
            key.element_size(),
            torch.get_num_threads(),
        )
        if status != 0:
            raise ValueError(f"a KV slot lies outside the cache's {slots_per_head} slots per head")

    def attend_decode(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
        new_kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``query`` [num_seqs, num_heads, head_dim] (rows may be strided, heads and dims contiguous),
        caches [num_kv_heads, num_blocks, block_size, head_dim] contiguous, ``block_tables``
        [num_seqs, max_blocks] int64 (padded), ``context_lens`` [num_seqs] int64 -> a new
        [num_seqs, num_heads, head_dim] tensor. ``new_kv``: ``(key, value, slots)``, the step's own
        K/V rows [num_seqs, num_kv_heads, head_dim] to write at ``slots`` first (in the same call)."""
        num_seqs, num_heads, head_dim = query.shape
        num_kv_heads, num_blocks, block_size, _ = key_cache.shape
        _check_cache("attend_decode", key_cache, value_cache, query.dtype, num_kv_heads, head_dim)
        _check_index("attend_decode", "block_tables", block_tables, (num_seqs, block_tables.shape[-1]))
        _check_index("attend_decode", "context_lens", context_lens, (num_seqs,))
        query = _rows_strided(query)
        out = torch.empty((num_seqs, num_heads, head_dim), dtype=query.dtype)
        new_key = new_value = slots = None
        if new_kv is not None:
            new_key, new_value, slots = _rows_strided(new_kv[0]), _rows_strided(new_kv[1]), new_kv[2]
            if new_key.shape != (num_seqs, num_kv_heads, head_dim) or new_value.shape != new_key.shape:
                raise ValueError(
                    f"attend_decode: the new K/V must be [{num_seqs}, {num_kv_heads}, {head_dim}], got "
                    f"{tuple(new_key.shape)} and {tuple(new_value.shape)}"
                )
            _check_index("attend_decode", "slots", slots, (num_seqs,))
            if new_key.stride(0) != new_value.stride(0):  # the kernel takes one token stride for both
                new_key, new_value = new_key.contiguous(), new_value.contiguous()
        status = getattr(self.library, "paged_decode_attention_" + DTYPE_SUFFIXES[query.dtype])(
            query.data_ptr(),
            query.stride(0),
            pointer(new_key),
            pointer(new_value),
            0 if new_key is None else new_key.stride(0),
            pointer(slots),
            key_cache.data_ptr(),
            value_cache.data_ptr(),
            block_tables.data_ptr(),
            block_tables.shape[1],
            context_lens.data_ptr(),
            out.data_ptr(),
            num_seqs,
            num_heads,
            num_kv_heads,
            head_dim,
            num_blocks,
            block_size,
            scale,
            torch.get_num_threads(),
        )
        if status == -1:
            raise ValueError(DECODE_ATTENTION_REFUSED)
        check_status(status, "decode-attention", f"{num_seqs} sequences")
        return out

    def attend_prefill(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        seqs: PrefillSequences,
        scale: float,
        out: torch.Tensor,
    ) -> None:
        """Causal attention of every sequence in ``seqs`` (its K/V already in the cache): ``query``
        [num_tokens, num_heads, head_dim] (rows may be strided) -> the same rows of ``out`` (same
        shape, contiguous); rows of other sequences are left alone."""
        num_tokens, num_heads, head_dim = query.shape
        num_kv_heads, num_blocks, block_size, _ = key_cache.shape
        _check_cache("attend_prefill", key_cache, value_cache, query.dtype, num_kv_heads, head_dim)
        num_seqs = len(seqs.query_len)
        if seqs.num_rows > num_tokens:
            raise ValueError(f"attend_prefill: a sequence's rows lie beyond the query's {num_tokens} tokens")
        if out.shape != query.shape or out.dtype != query.dtype or not out.is_contiguous():
            raise ValueError(f"attend_prefill: out must be a contiguous {tuple(query.shape)} like the query")
        query = _rows_strided(query)
        tables = seqs.block_tables
        status = getattr(self.library, "paged_prefill_attention_" + DTYPE_SUFFIXES[query.dtype])(
            query.data_ptr(),
            query.stride(0),
            key_cache.data_ptr(),
            value_cache.data_ptr(),
            tables.data_ptr(),
            tables.shape[1],
            seqs.query_start.data_ptr(),
            seqs.query_len.data_ptr(),
            seqs.context_lens.data_ptr(),
            out.data_ptr(),
            out.stride(0),
            num_seqs,
            num_heads,
            num_kv_heads,
            head_dim,
            num_blocks,
            block_size,
            scale,
            torch.get_num_threads(),
        )
        check_status(
            status,
            "prefill-attention",
            f"{num_seqs} sequences: a query longer than its context, a "
            "context beyond its block table or a block outside the cache",
        )


def _check_cache(
    kernel: str,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    dtype: torch.dtype,
    num_kv_heads: int,
    head_dim: int,
) -> None:
    """Caches [num_kv_heads, num_blocks, block_size, head_dim] of ``dtype``, contiguous, alike."""
    if (
        key_cache.dim() != 4
        or key_cache.shape[0] != num_kv_heads
        or key_cache.shape[3] != head_dim
        or key_cache.dtype != dtype
        or value_cache.shape != key_cache.shape
        or value_cache.dtype != dtype
        or not (key_cache.is_contiguous() and value_cache.is_contiguous())
        or key_cache.device.type != "cpu"
    ):
        raise ValueError(
            f"{kernel}: the caches must be contiguous CPU {str(dtype).removeprefix('torch.')} "
            f"[{num_kv_heads}, blocks, block_size, {head_dim}] (the query's dtype), got "
            f"{str(key_cache.dtype).removeprefix('torch.')} {tuple(key_cache.shape)}"
        )


def _check_index(kernel: str, name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tensor.dtype != torch.int64 or tuple(tensor.shape) != shape or not tensor.is_contiguous():
        raise ValueError(
            f"{kernel}: {name} must be a contiguous int64 {list(shape)}, got "
            f"{str(tensor.dtype).removeprefix('torch.')} {tuple(tensor.shape)}"
        )


def _rows_strided(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` [rows, heads, dim] with heads and dims contiguous (rows may be strided); else a copy."""
    if tensor.stride(2) != 1 or tensor.stride(1) != tensor.shape[2]:
        return tensor.contiguous()
    return tensor
