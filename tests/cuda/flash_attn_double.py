"""A PyTorch test double of flash-attn 2.x's two paged entry points, written from their documented
semantics (flash_attn/flash_attn_interface.py docstrings), for machines without flash-attn.

- ``flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...,
  softmax_scale=None, causal=False, ..., block_table=None)``: ``q`` is ``(total_q, nheads, headdim)``;
  ``k``/``v`` are ``(total_k, nheads_k, headdim)``, or ``(num_blocks, page_block_size, nheads_k,
  headdim)`` with a ``block_table`` ``(batch, max_num_blocks_per_seq)`` int32; ``cu_seqlens_*`` are
  int32 ``(batch + 1,)``; with ``causal`` the mask is aligned to the bottom-right corner (query ``i``
  of a sequence with ``sq`` queries and ``sk`` keys sees keys ``j <= i + sk - sq``).
- ``flash_attn_with_kvcache(q, k_cache, v_cache, ..., cache_seqlens=None, ..., block_table=None,
  softmax_scale=None, causal=False, ...)``: ``q`` is ``(batch, seqlen, nheads, headdim)``; the cache
  is paged as above (``page_block_size`` a multiple of 256 in flash-attn 2.x); ``cache_seqlens``
  int32 ``(batch,)`` says how many cached tokens each sequence has. Returns ``(batch, seqlen,
  nheads, headdim)``.

Both accept only what flash-attn accepts (dtypes, int32 index tensors, a contiguous last
dimension, GQA head counts, page sizes) and raise like it on the rest, so the executor's wiring is
checked, not just its arithmetic. Arguments Hetero never passes raise ``NotImplementedError``.
``with_kvcache`` has no host synchronisation, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.nn import functional as F

from hetero_plugins_cuda.kernels import FlashAttnKernels


class FlashAttnDouble:
    """``page_block_multiple``: 256 like flash-attn 2.x, or smaller to mimic forks that allow it."""

    def __init__(self, page_block_multiple: int = 256, dtypes=(torch.float16, torch.bfloat16)):
        self.page_block_multiple = page_block_multiple
        self.dtypes = tuple(dtypes)
        self.calls: Counter[str] = Counter()

    def kernels(self, device_types=("cpu", "cuda")) -> FlashAttnKernels:
        return FlashAttnKernels(
            name="flash-attn test double (PyTorch)",
            varlen=self.flash_attn_varlen_func,
            with_kvcache=self.flash_attn_with_kvcache,
            page_block_multiple=self.page_block_multiple,
            dtypes=self.dtypes,
            device_types=tuple(device_types),
        )

    def flash_attn_varlen_func(
        self,
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        alibi_slopes=None,
        deterministic=False,
        return_attn_probs=False,
        block_table=None,
    ):
        _unsupported(
            dropout_p=dropout_p != 0.0,
            window_size=tuple(window_size) != (-1, -1),
            softcap=softcap != 0.0,
            alibi_slopes=alibi_slopes is not None,
            return_attn_probs=return_attn_probs,
        )
        self._check_qkv(q, k, v, paged=block_table is not None)
        _check_int32(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, block_table=block_table)
        self.calls["varlen_paged" if block_table is not None else "varlen"] += 1
        cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        if len(cu_q) != len(cu_k) or cu_q[-1] != q.shape[0]:
            raise RuntimeError("cu_seqlens_q must have batch_size + 1 entries ending at total_q")
        if block_table is None and cu_k[-1] != k.shape[0]:
            raise RuntimeError("cu_seqlens_k must end at total_k")
        scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
        out = torch.empty_like(q)
        for b in range(len(cu_q) - 1):
            num_q, num_k = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
            if num_q > max_seqlen_q or num_k > max_seqlen_k:
                raise RuntimeError(
                    f"sequence {b}: seqlens ({num_q}, {num_k}) exceed max_seqlen "
                    f"({max_seqlen_q}, {max_seqlen_k})"
                )
            if block_table is None:
                keys, values = k[cu_k[b] : cu_k[b + 1]], v[cu_k[b] : cu_k[b + 1]]
            else:
                num_blocks = -(-num_k // k.shape[1])
                if num_blocks > block_table.shape[1]:
                    raise RuntimeError(
                        f"sequence {b}: {num_k} keys need {num_blocks} blocks; block_table has "
                        f"{block_table.shape[1]}"
                    )
                blocks = block_table[b, :num_blocks].long()
                keys, values = k[blocks].flatten(0, 1)[:num_k], v[blocks].flatten(0, 1)[:num_k]
            mask = _causal_mask(num_q, num_k, q.device) if causal else None
            out[cu_q[b] : cu_q[b + 1]] = _attend(
                q[cu_q[b] : cu_q[b + 1]][None], keys[None], values[None], mask, scale
            )[0]
        return out

    def flash_attn_with_kvcache(
        self,
        q,
        k_cache,
        v_cache,
        k=None,
        v=None,
        rotary_cos=None,
        rotary_sin=None,
        cache_seqlens=None,
        cache_batch_idx=None,
        cache_leftpad=None,
        block_table=None,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        rotary_interleaved=True,
        alibi_slopes=None,
        num_splits=0,
        return_softmax_lse=False,
    ):
        _unsupported(
            k=k is not None,
            v=v is not None,
            rotary_cos=rotary_cos is not None,
            cache_batch_idx=cache_batch_idx is not None,
            cache_leftpad=cache_leftpad is not None,
            window_size=tuple(window_size) != (-1, -1),
            softcap=softcap != 0.0,
            alibi_slopes=alibi_slopes is not None,
            return_softmax_lse=return_softmax_lse,
        )
        if q.dim() != 4:
            raise RuntimeError("q must be (batch_size, seqlen, nheads, headdim)")
        self._check_qkv(q, k_cache, v_cache, paged=block_table is not None)
        _check_int32(cache_seqlens=cache_seqlens, block_table=block_table)
        self.calls["with_kvcache"] += 1
        batch, num_q = q.shape[:2]
        if block_table is not None:
            if block_table.shape[0] != batch:
                raise RuntimeError("block_table must have batch_size rows")
            index = block_table.long()
            keys, values = k_cache[index].flatten(1, 2), v_cache[index].flatten(1, 2)
        else:
            keys, values = k_cache[:batch], v_cache[:batch]
        num_k = keys.shape[1]
        lengths = cache_seqlens if cache_seqlens is not None else torch.full((batch,), num_k, device=q.device)
        key_pos = torch.arange(num_k, device=q.device)
        mask = key_pos[None, None, :] < lengths.long()[:, None, None]  # (batch, 1, num_k)
        if causal:
            query_pos = lengths.long()[:, None] - num_q + torch.arange(num_q, device=q.device)[None, :]
            mask = mask & (key_pos[None, None, :] <= query_pos[:, :, None])  # (batch, num_q, num_k)
        scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
        return _attend(q, keys, values, mask[:, None], scale)

    def _check_qkv(self, q, k, v, *, paged: bool) -> None:
        if not (q.dtype == k.dtype == v.dtype) or q.dtype not in self.dtypes:
            raise RuntimeError(
                f"FlashAttention only supports {self.dtypes}; got q {q.dtype}, k {k.dtype}, v {v.dtype}"
            )
        if not (q.device == k.device == v.device):
            raise RuntimeError("q, k and v must be on the same device")
        if any(t.stride(-1) != 1 for t in (q, k, v)):
            raise RuntimeError("Input tensor must have contiguous last dimension")
        if q.shape[-2] % k.shape[-2]:
            raise RuntimeError("Number of heads in key/value must divide number of heads in query")
        if paged and (k.dim() != 4 or k.shape[1] % self.page_block_multiple):
            raise RuntimeError(f"Paged KV cache block size must be divisible by {self.page_block_multiple}")


def _attend(q, k, v, mask, scale):
    """``q`` (batch, sq, h, d), ``k``/``v`` (batch, sk, hk, d), ``mask`` broadcastable to
    (batch, h, sq, sk) or None -> (batch, sq, h, d) in ``q``'s dtype."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=mask,
        scale=scale,
        enable_gqa=q.shape[2] != k.shape[2],
    )
    return out.transpose(1, 2)


def _causal_mask(num_q: int, num_k: int, device) -> torch.Tensor:
    """Bottom-right aligned: query ``i`` sees keys ``j <= i + num_k - num_q``."""
    return (
        torch.arange(num_k, device=device)[None, :]
        <= torch.arange(num_q, device=device)[:, None] + num_k - num_q
    )


def _check_int32(**tensors) -> None:
    for name, tensor in tensors.items():
        if tensor is not None and tensor.dtype != torch.int32:
            raise RuntimeError(f"{name} must have dtype torch.int32, got {tensor.dtype}")


def _unsupported(**flags) -> None:
    used = [name for name, is_set in flags.items() if is_set]
    if used:
        raise NotImplementedError(f"the flash-attn test double does not implement {', '.join(used)}")
