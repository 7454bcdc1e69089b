"""Paged prefill attention: variable-length, causal, continuing after cached tokens.

Grid ``(sequence, query head, query tile)``. Sequence ``i``'s ``query_lens[i]`` new tokens sit at flat
rows ``query_starts[i]:...`` of ``query`` and at positions ``context_len - query_len ...`` of its
sequence; their K/V are already in the cache (``store_kv`` ran first), so every key, cached prefix
(chunked prefill, a prefix-cache hit) or new, is read through the block table. Query position ``p``
sees keys ``0..p``. Programs of a tile past the sequence's query length do nothing.
"""

from __future__ import annotations

import torch
import triton.language as tl

from hetero_plugins_triton.kernels.compile import cdiv, compile_kernel, next_power_of_2
from hetero_plugins_triton.kernels.decode_attention import LOG2_E, dot_precision


def prefill_attention_kernel(
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    out_ptr,
    block_tables_ptr,
    query_starts_ptr,
    query_lens_ptr,
    context_lens_ptr,
    scale_log2,
    query_stride_t,
    query_stride_h,
    out_stride_t,
    out_stride_h,
    block_table_stride,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    tile = tl.program_id(2)
    kv_head = head // GROUP
    query_len = tl.load(query_lens_ptr + seq)
    query_start = tl.load(query_starts_ptr + seq).to(tl.int64)
    context_len = tl.load(context_lens_ptr + seq)
    num_cached = context_len - query_len

    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < query_len
    query_pos = num_cached + rows
    dims = tl.arange(0, DIM_PAD)
    dim_mask = dims < HEAD_DIM
    q_mask = row_mask[:, None] & dim_mask[None, :]
    q_offsets = (query_start + rows)[:, None] * query_stride_t + head * query_stride_h + dims[None, :]
    q = tl.load(query_ptr + q_offsets, mask=q_mask, other=0.0)
    # Causal bound of this tile; zero for a tile past the query (the loop then does nothing).
    kv_end = tl.where(
        tile * BLOCK_M < query_len, tl.minimum(context_len, num_cached + (tile + 1) * BLOCK_M), 0
    )

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_PAD], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * block_table_stride
    for tile_start in range(0, kv_end, BLOCK_N):
        positions = tile_start + tl.arange(0, BLOCK_N)
        valid = positions < kv_end
        blocks = tl.load(table + positions // PAGE, mask=valid, other=0).to(tl.int64)
        slots = blocks * PAGE + positions % PAGE
        offsets = slots[:, None] * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM + dims[None, :]
        kv_mask = valid[:, None] & dim_mask[None, :]
        k = tl.load(key_cache_ptr + offsets, mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        visible = valid[None, :] & (positions[None, :] <= query_pos[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))  # finite: key 0 is visible to every row
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(value_cache_ptr + offsets, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    out_offsets = (query_start + rows)[:, None] * out_stride_t + head * out_stride_h + dims[None, :]
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def prefill_attention(
    query,
    key_cache,
    value_cache,
    block_tables,
    query_starts,
    query_lens,
    context_lens,
    out,
    *,
    max_query_len: int,
    scale: float,
    block_m: int,
    block_n: int,
    interpret: bool,
) -> None:
    """Causal attention of each sequence's new rows of ``query`` (``[num_tokens, num_heads, head_dim]``)
    to its whole context in the paged caches; writes the same rows of ``out``.

    ``block_tables`` ``[num_seqs, max_blocks]`` and ``query_starts``/``query_lens``/``context_lens``
    ``[num_seqs]`` are int32; ``max_query_len`` (the largest ``query_lens``) sizes the grid.
    """
    num_seqs = query_lens.shape[0]
    num_heads, head_dim = query.shape[1:]
    _, page, num_kv_heads, _ = key_cache.shape
    _check(query, key_cache, value_cache, block_tables, out, block_m, block_n)
    if num_seqs == 0 or max_query_len == 0:
        return
    grid = (num_seqs, num_heads, cdiv(max_query_len, block_m))
    compile_kernel(prefill_attention_kernel, interpret)[grid](
        query,
        key_cache,
        value_cache,
        out,
        block_tables,
        query_starts,
        query_lens,
        context_lens,
        scale * LOG2_E,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        NUM_KV_HEADS=num_kv_heads,
        GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        DIM_PAD=max(16, next_power_of_2(head_dim)),
        PAGE=page,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        PRECISION=dot_precision(query.dtype),
        num_warps=4 if block_m * block_n <= 4096 else 8,
        num_stages=2,
    )


def _check(query, key_cache, value_cache, block_tables, out, block_m, block_n) -> None:
    num_heads, head_dim = query.shape[1:]
    num_kv_heads, cache_head_dim = key_cache.shape[2:]
    if cache_head_dim != head_dim or value_cache.shape != key_cache.shape or num_heads % num_kv_heads:
        raise ValueError(
            f"prefill_attention: query {tuple(query.shape)} does not fit the cache "
            f"{tuple(key_cache.shape)} (head_dim must match, num_heads a multiple of num_kv_heads)"
        )
    if out.shape != query.shape or out.dtype != query.dtype or key_cache.dtype != query.dtype:
        raise ValueError(
            f"prefill_attention: out {tuple(out.shape)} {out.dtype} and cache {key_cache.dtype} "
            f"must match query {tuple(query.shape)} {query.dtype}"
        )
    if (
        query.stride(2) != 1
        or out.stride(2) != 1
        or not key_cache.is_contiguous()
        or not value_cache.is_contiguous()
    ):
        raise ValueError("prefill_attention: head_dim of query/out and the whole KV cache must be contiguous")
    if block_tables.dtype != torch.int32 or block_tables.stride(1) != 1:
        raise ValueError("prefill_attention: block_tables must be int32, row-major")
    for name, size in (("block_m", block_m), ("block_n", block_n)):
        if size < 16 or size & (size - 1):
            raise ValueError(f"prefill_attention: {name} {size} must be a power of two >= 16")
