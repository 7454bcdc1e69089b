"""Paged decode attention with split-K (flash decoding): one query token per sequence.

Grid ``(sequence, KV head, split)``. The query heads sharing a KV head (GQA/MQA) are one tile of
``GROUP_PAD`` rows, so each K/V tile is read once for the whole group. A sequence's KV tiles are
dealt evenly to ``num_splits`` programs; each walks its share through the block table with an online
softmax and writes a normalised partial output plus its log-sum-exp (base 2). ``decode_merge``
combines the splits. With one split the kernel writes the final output itself.
"""

from __future__ import annotations

import torch
import triton.language as tl

from hetero_plugins_triton.kernels.compile import compile_kernel, next_power_of_2
from hetero_plugins_triton.kernels.decode_merge import merge_splits

LOG2_E = 1.4426950408889634


def decode_split_kernel(
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    query_rows_ptr,
    out_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    scale_log2,
    num_splits,
    query_stride_t,
    query_stride_h,
    out_stride_t,
    out_stride_h,
    block_table_stride,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WRITE_FINAL: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)
    row = tl.load(query_rows_ptr + seq).to(tl.int64)
    tiles_per_split = tl.cdiv(tl.cdiv(context_len, BLOCK_N), num_splits)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, context_len)

    member = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + member
    head_mask = member < GROUP
    dims = tl.arange(0, DIM_PAD)
    dim_mask = dims < HEAD_DIM
    q_mask = head_mask[:, None] & dim_mask[None, :]
    q = tl.load(
        query_ptr + row * query_stride_t + heads[:, None] * query_stride_h + dims[None, :],
        mask=q_mask,
        other=0.0,
    )
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * block_table_stride
    for tile_start in range(start, end, BLOCK_N):
        positions = tile_start + tl.arange(0, BLOCK_N)
        valid = positions < end
        blocks = tl.load(table + positions // PAGE, mask=valid, other=0).to(tl.int64)
        slots = blocks * PAGE + positions % PAGE
        offsets = slots[:, None] * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM + dims[None, :]
        kv_mask = valid[:, None] & dim_mask[None, :]
        k = tl.load(key_cache_ptr + offsets, mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(value_cache_ptr + offsets, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if WRITE_FINAL:
        out_offsets = row * out_stride_t + heads[:, None] * out_stride_h + dims[None, :]
        tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        partial = (seq * NUM_HEADS + heads).to(tl.int64) * num_splits + split
        tl.store(partial_lse_ptr + partial, lse, mask=head_mask)
        tl.store(partial_out_ptr + partial[:, None] * HEAD_DIM + dims[None, :], out, mask=q_mask)


def decode_attention(
    query,
    key_cache,
    value_cache,
    block_tables,
    context_lens,
    query_rows,
    out,
    *,
    scale: float,
    num_splits: int,
    block_n: int,
    interpret: bool,
) -> None:
    """Attend ``query[query_rows[i]]`` (``[num_tokens, num_heads, head_dim]``) to sequence ``i``'s
    ``context_lens[i]`` cached tokens through ``block_tables[i]``; write ``out[query_rows[i]]``.

    Caches are ``[num_blocks, block_size, num_kv_heads, head_dim]``; ``block_tables`` is
    ``[num_seqs, max_blocks]`` int32; ``context_lens`` and ``query_rows`` are ``[num_seqs]`` int32.
    """
    num_seqs = context_lens.shape[0]
    num_heads, head_dim = query.shape[1:]
    _, page, num_kv_heads, cache_head_dim = key_cache.shape
    _check(query, key_cache, value_cache, block_tables, query_rows, out, num_splits, block_n)
    if num_seqs == 0:
        return
    group = num_heads // num_kv_heads
    write_final = num_splits == 1
    if write_final:
        partial_out = partial_lse = out  # unused by the kernel
    else:
        partial_out = torch.empty(
            (num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=query.device
        )
        partial_lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=query.device)
    compile_kernel(decode_split_kernel, interpret)[(num_seqs, num_kv_heads, num_splits)](
        query,
        key_cache,
        value_cache,
        block_tables,
        context_lens,
        query_rows,
        out,
        partial_out,
        partial_lse,
        scale * LOG2_E,
        num_splits,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        GROUP=group,
        GROUP_PAD=max(16, next_power_of_2(group)),
        HEAD_DIM=head_dim,
        DIM_PAD=max(16, next_power_of_2(head_dim)),
        PAGE=page,
        BLOCK_N=block_n,
        WRITE_FINAL=write_final,
        PRECISION=dot_precision(query.dtype),
        num_warps=4,
        num_stages=2,
    )
    if not write_final:
        merge_splits(partial_out, partial_lse, query_rows, out, interpret=interpret)


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 runs exact fp32 dots ("ieee"), not TF32; fp16/bf16 ignore the setting."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _check(query, key_cache, value_cache, block_tables, query_rows, out, num_splits, block_n) -> None:
    num_heads, head_dim = query.shape[1:]
    num_kv_heads, cache_head_dim = key_cache.shape[2:]
    if cache_head_dim != head_dim or value_cache.shape != key_cache.shape or num_heads % num_kv_heads:
        raise ValueError(
            f"decode_attention: query {tuple(query.shape)} does not fit the cache "
            f"{tuple(key_cache.shape)} (head_dim must match, num_heads a multiple of num_kv_heads)"
        )
    if out.shape != query.shape or out.dtype != query.dtype or key_cache.dtype != query.dtype:
        raise ValueError(
            f"decode_attention: out {tuple(out.shape)} {out.dtype} and cache {key_cache.dtype} "
            f"must match query {tuple(query.shape)} {query.dtype}"
        )
    if (
        query.stride(2) != 1
        or out.stride(2) != 1
        or not key_cache.is_contiguous()
        or not value_cache.is_contiguous()
    ):
        raise ValueError("decode_attention: head_dim of query/out and the whole KV cache must be contiguous")
    if block_tables.dtype != torch.int32 or query_rows.dtype != torch.int32 or block_tables.stride(1) != 1:
        raise ValueError(
            "decode_attention: block_tables and query_rows must be int32 (block tables row-major)"
        )
    if num_splits < 1 or block_n < 16 or block_n & (block_n - 1):
        raise ValueError(
            f"decode_attention: num_splits {num_splits} must be >= 1 and block_n {block_n} "
            "a power of two >= 16"
        )
