"""flash-attn-4 (``flash_attn.cute``, the CuTe DSL kernels) behind the executor's flash-attn 2.x calls.

flash-attn-4 has one forward entry point for everything, ``flash_attn_varlen_func(q, k, v, qv=None,
cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, min_seqlen_k=None,
seqused_q=None, seqused_k=None, gather_kv_indices=None, page_table=None, softmax_scale=None,
causal=False, ...)``, which returns ``(out, lse)`` (``lse`` None unless ``return_lse``). Every
argument after ``k, v`` goes by keyword here: its fourth positional parameter is ``qv`` (MLA), not
flash-attn 2.x's ``cu_seqlens_q``. A paged KV cache is ``k``/``v`` ``(num_pages, page_size,
nheads_k, headdim)`` with ``page_table`` int32 ``(batch, max_pages)`` (contiguous rows) and the keys
per sequence in ``seqused_k`` int32 ``(batch,)``: ``cu_seqlens_k`` is refused beside ``page_table``.
Causal masks align to the bottom-right corner, as in flash-attn 2.x.

- ``varlen`` (flash-attn 2.x's ``flash_attn_varlen_func``): fresh prompts pass ``cu_seqlens_k``; a
  paged call turns it into ``seqused_k`` (its differences, one small device op, no host sync);
- ``with_kvcache`` (decodes): ``q`` ``(batch, 1, nheads, headdim)`` in flash-attn-4's batched form
  with ``seqused_k = cache_seqlens`` and ``page_table = block_table``; ``max_seqlen_k`` is left to
  flash-attn-4, which takes the table's width, so one captured CUDA graph covers every replay.

Page sizes (flash-attn-4 4.0.0b36, ``interface.py``): any; a page of exactly the kernel's key tile
(``tile_n``: 128 for head_dim <= 128 on SM90 and SM100) loads by TMA, any other size through cp.async
(``paged_kv_non_tma``), so ``block_size = 128`` is the fast one for Qwen3 / Llama heads. Paged KV
runs on compute capability 9.x (Hopper: H100, H200), 10.x and 11.x (Blackwell), not on 8.x or 12.x;
dtypes float16 / bfloat16; head_dim a multiple of 8, at most 256 on SM90 (at most 128, or 192 / 256
exactly, on SM100). SM90 has no split-KV (``num_splits`` stays 1, flash-attn-4's default).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hetero_plugins_cuda.kernels import FlashAttnKernels

FAST_BLOCK_SIZE = 128  # the key tile of flash-attn-4's SM90 / SM100 kernels for head_dim <= 128
PAGED_COMPUTE_CAPABILITIES = (9, 10, 11)  # majors whose kernels take a page table


def flash_attn4_kernels(varlen_func: Callable, version: str) -> FlashAttnKernels:
    """``varlen_func``: ``flash_attn.cute.flash_attn_varlen_func`` (or a double with its signature)."""

    def varlen(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale=None,
        causal=False,
        block_table=None,
    ):
        if block_table is None:
            out, _ = varlen_func(
                q,
                k,
                v,
                cu_seqlens_q=cu_seqlens_q,
                cu_seqlens_k=cu_seqlens_k,
                max_seqlen_q=max_seqlen_q,
                max_seqlen_k=max_seqlen_k,
                softmax_scale=softmax_scale,
                causal=causal,
            )
            return out
        seqused_k = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
        out, _ = varlen_func(
            q,
            k,
            v,
            cu_seqlens_q=cu_seqlens_q,
            seqused_k=seqused_k,
            page_table=block_table,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k,
            softmax_scale=softmax_scale,
            causal=causal,
        )
        return out

    def with_kvcache(
        q, k_cache, v_cache, cache_seqlens=None, block_table=None, softmax_scale=None, causal=False
    ):
        out, _ = varlen_func(
            q,
            k_cache,
            v_cache,
            seqused_k=cache_seqlens,
            page_table=block_table,
            softmax_scale=softmax_scale,
            causal=causal,
        )
        return out

    return FlashAttnKernels(
        name=f"flash-attn-4 {version}",
        varlen=varlen,
        with_kvcache=with_kvcache,
        page_block_multiple=1,
        dtypes=(torch.float16, torch.bfloat16),
        device_types=("cuda",),
        fast_block_size=FAST_BLOCK_SIZE,
        compute_capabilities=PAGED_COMPUTE_CAPABILITIES,
    )
