"""KV store: write each new token's K and V into the paged cache at its slot.

Cache layout ``[num_blocks, block_size, num_kv_heads, head_dim]`` (contiguous), so slot ``s`` is the
row ``s`` of the cache seen as ``[num_slots, num_kv_heads * head_dim]``. A slot below zero means
"padding, write nothing". Each program copies ``TOKENS`` whole rows.
"""

from __future__ import annotations

import torch
import triton.language as tl

from hetero_plugins_triton.kernels.compile import cdiv, compile_kernel, next_power_of_2

_ELEMENTS_PER_PROGRAM = 4096


def kv_store_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_ptr,
    num_tokens,
    key_stride_t,
    key_stride_h,
    value_stride_t,
    value_stride_h,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ROW_PAD: tl.constexpr,
    TOKENS: tl.constexpr,
):
    tokens = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    in_range = tokens < num_tokens
    slots = tl.load(slot_ptr + tokens, mask=in_range, other=-1).to(tl.int64)
    columns = tl.arange(0, ROW_PAD)
    head = columns // HEAD_DIM
    dim = columns % HEAD_DIM
    mask = ((slots >= 0) & in_range)[:, None] & (columns < NUM_KV_HEADS * HEAD_DIM)[None, :]
    rows = tokens.to(tl.int64)[:, None]
    cache_offsets = slots[:, None] * (NUM_KV_HEADS * HEAD_DIM) + columns[None, :]
    key = tl.load(key_ptr + rows * key_stride_t + (head * key_stride_h + dim)[None, :], mask=mask)
    tl.store(key_cache_ptr + cache_offsets, key, mask=mask)
    value = tl.load(value_ptr + rows * value_stride_t + (head * value_stride_h + dim)[None, :], mask=mask)
    tl.store(value_cache_ptr + cache_offsets, value, mask=mask)


def store_kv(key, value, key_cache, value_cache, slot_mapping, *, interpret: bool) -> None:
    """``key``/``value`` ``[num_tokens, num_kv_heads, head_dim]`` (head_dim contiguous) go to
    ``slot_mapping`` ``[num_tokens]`` (int64) of the caches
    ``[num_blocks, block_size, num_kv_heads, head_dim]``."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if value.shape != key.shape or key_cache.shape[-2:] != (num_kv_heads, head_dim):
        raise ValueError(
            f"store_kv: key {tuple(key.shape)}, value {tuple(value.shape)} and cache "
            f"{tuple(key_cache.shape)} disagree on [num_kv_heads, head_dim]"
        )
    if key.dtype != key_cache.dtype or value.dtype != value_cache.dtype:
        raise ValueError(f"store_kv: new K/V are {key.dtype} but the cache holds {key_cache.dtype}")
    if slot_mapping.shape != (num_tokens,):
        raise ValueError(
            f"store_kv: slot_mapping has shape {tuple(slot_mapping.shape)}, expected ({num_tokens},)"
        )
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("store_kv: the KV cache must be contiguous")
    key, value = _inner_contiguous(key), _inner_contiguous(value)
    if num_tokens == 0:
        return
    row_pad = next_power_of_2(num_kv_heads * head_dim)
    tokens = max(1, _ELEMENTS_PER_PROGRAM // row_pad)
    grid = (cdiv(num_tokens, tokens),)
    compile_kernel(kv_store_kernel, interpret)[grid](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        num_tokens,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        ROW_PAD=row_pad,
        TOKENS=tokens,
    )


def _inner_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.stride(2) == 1 else tensor.contiguous()
