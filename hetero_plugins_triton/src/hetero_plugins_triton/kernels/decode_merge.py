"""Merge the splits of flash decoding: a log-sum-exp weighted sum of the partial outputs.

Grid ``(sequence, query head)``. Split ``s`` holds a normalised output ``o_s`` and ``lse_s`` (base 2;
``-inf`` for a split that got no tokens). The result is ``sum_s 2^(lse_s - m) o_s / sum_s 2^(lse_s - m)``
with ``m = max_s lse_s``, cast to the output dtype.
"""

from __future__ import annotations

import triton.language as tl

from hetero_plugins_triton.kernels.compile import compile_kernel, next_power_of_2


def decode_merge_kernel(
    partial_out_ptr,
    partial_lse_ptr,
    query_rows_ptr,
    out_ptr,
    num_splits,
    out_stride_t,
    out_stride_h,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = tl.load(query_rows_ptr + seq).to(tl.int64)
    splits = tl.arange(0, SPLITS_PAD)
    split_mask = splits < num_splits
    partial = (seq * NUM_HEADS + head).to(tl.int64) * num_splits + splits
    lse = tl.load(partial_lse_ptr + partial, mask=split_mask, other=float("-inf"))
    weights = tl.exp2(lse - tl.max(lse, 0))
    weights = weights / tl.sum(weights, 0)
    dims = tl.arange(0, DIM_PAD)
    dim_mask = dims < HEAD_DIM
    parts = tl.load(
        partial_out_ptr + partial[:, None] * HEAD_DIM + dims[None, :],
        mask=split_mask[:, None] & dim_mask[None, :],
        other=0.0,
    )
    out = tl.sum(parts * weights[:, None], 0)
    tl.store(
        out_ptr + row * out_stride_t + head * out_stride_h + dims,
        out.to(out_ptr.dtype.element_ty),
        mask=dim_mask,
    )


def merge_splits(partial_out, partial_lse, query_rows, out, *, interpret: bool) -> None:
    """``partial_out`` ``[num_seqs, num_heads, num_splits, head_dim]`` fp32 and ``partial_lse``
    ``[num_seqs, num_heads, num_splits]`` -> ``out[query_rows[i]]`` ``[num_heads, head_dim]``."""
    num_seqs, num_heads, num_splits, head_dim = partial_out.shape
    compile_kernel(decode_merge_kernel, interpret)[(num_seqs, num_heads)](
        partial_out,
        partial_lse,
        query_rows,
        out,
        num_splits,
        out.stride(0),
        out.stride(1),
        NUM_HEADS=num_heads,
        HEAD_DIM=head_dim,
        DIM_PAD=next_power_of_2(head_dim),
        SPLITS_PAD=next_power_of_2(num_splits),
        num_warps=4,
    )
