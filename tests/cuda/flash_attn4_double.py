"""A PyTorch test double of flash-attn-4's forward entry point (``flash_attn.cute.flash_attn_varlen_func``,
4.0.0b36), written from its signature and the checks in ``_flash_attn_fwd`` (flash_attn/cute/interface.py),
for machines without a Hopper or Blackwell GPU.

``flash_attn_varlen_func(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
max_seqlen_k=None, min_seqlen_k=None, seqused_q=None, seqused_k=None, gather_kv_indices=None,
page_table=None, softmax_scale=None, causal=False, ...)`` returns ``(out, lse)``. It refuses what
flash-attn-4 refuses: ``cu_seqlens_k`` beside ``page_table``; a page table, ``cu_seqlens_*`` or
``seqused_k`` that is not int32 or not contiguous; shapes that disagree with the batch; dtypes other
than float16 / bfloat16 (``dtypes`` widens that for CPU float32 tests); a head count the KV heads do
not divide. Page sizes: any (``page_sizes`` records the ones seen). Arguments Hetero never passes
(``qv``, a positional fourth argument included, ``seqused_q``, windows, softcap, splits, ...) raise
``NotImplementedError``. The arithmetic is flash-attn 2.x's double's (bottom-right causal masks, like
flash-attn-4); the batched paged form has no host synchronisation, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import torch

from hetero_plugins_cuda.flash_attn4 import flash_attn4_kernels
from tests.cuda.flash_attn_double import FlashAttnDouble


class FlashAttn4Double:
    def __init__(self, dtypes=(torch.float16, torch.bfloat16)):
        self.dtypes = tuple(dtypes)
        self.calls: Counter[str] = Counter()
        self.page_sizes: set[int] = set()
        self._math = FlashAttnDouble(page_block_multiple=1, dtypes=self.dtypes)  # the arithmetic only

    def kernels(self, device_types=("cpu", "cuda")):
        kernels = flash_attn4_kernels(self.flash_attn_varlen_func, "test double (PyTorch)")
        return replace(kernels, dtypes=self.dtypes, device_types=tuple(device_types))

    def flash_attn_varlen_func(
        self,
        q,
        k,
        v,
        qv=None,
        cu_seqlens_q=None,
        cu_seqlens_k=None,
        max_seqlen_q=None,
        max_seqlen_k=None,
        min_seqlen_k=None,
        seqused_q=None,
        seqused_k=None,
        gather_kv_indices=None,
        page_table=None,
        softmax_scale=None,
        causal=False,
        window_size=(None, None),
        learnable_sink=None,
        softcap=0.0,
        num_splits=1,
        pack_gqa=None,
        deterministic=False,
        score_mod=None,
        score_mod_bwd=None,
        mask_mod=None,
        block_sparse_tensors=None,
        aux_tensors=None,
        aux_scalars=None,
        return_lse=False,
        **rest,
    ):
        unused = dict(
            qv=qv,
            min_seqlen_k=min_seqlen_k,
            seqused_q=seqused_q,
            gather_kv_indices=gather_kv_indices,
            learnable_sink=learnable_sink,
            score_mod=score_mod,
            mask_mod=mask_mod,
            block_sparse_tensors=block_sparse_tensors,
            aux_tensors=aux_tensors,
            **rest,
        )
        _unsupported(
            window_size=tuple(window_size) != (None, None),
            softcap=softcap != 0.0,
            num_splits=num_splits != 1,
            return_lse=return_lse,
            **{name: value is not None for name, value in unused.items()},
        )
        if not (q.dtype == k.dtype == v.dtype) or v.dtype not in self.dtypes:
            raise AssertionError(f"inputs must be {self.dtypes}; got q {q.dtype}, k {k.dtype}, v {v.dtype}")
        for tensor in (cu_seqlens_q, cu_seqlens_k, seqused_k):
            if tensor is not None and (tensor.dtype != torch.int32 or tensor.stride(0) != 1):
                raise AssertionError(
                    "cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k must be int32 and contiguous"
                )
        batch = q.shape[0] if cu_seqlens_q is None else cu_seqlens_q.shape[0] - 1
        if q.shape[-2] % v.shape[-2]:
            raise AssertionError("num_head must be divisible by num_head_kv")
        if seqused_k is not None and seqused_k.shape != (batch,):
            raise AssertionError("seqused_k must have shape (batch_size,)")
        if page_table is not None:
            if cu_seqlens_k is not None:
                raise AssertionError("page_table is not supported with cu_seqlens_k")
            if page_table.dtype != torch.int32:
                raise AssertionError("page_table must be int32")
            if page_table.stride(-1) != 1:
                raise AssertionError("page_table must be contiguous in the last dimension")
            if page_table.dim() != 2 or page_table.shape[0] != batch or k.dim() != 4 or k.shape != v.shape:
                raise AssertionError(
                    "page_table must be (batch, max_num_pages_per_seq), k / v (num_pages, "
                    "page_size, nheads_k, headdim)"
                )
            if seqused_k is None:
                raise NotImplementedError("the flash-attn-4 double reads a paged cache by seqused_k only")
            self.page_sizes.add(k.shape[1])
        if cu_seqlens_q is None:  # batched q (batch, seqlen_q, nheads, headdim)
            if page_table is None or q.dim() != 4:
                raise NotImplementedError("the flash-attn-4 double takes batched q with a page table only")
            self.calls["batched_paged"] += 1
            out = self._math.flash_attn_with_kvcache(
                q,
                k,
                v,
                cache_seqlens=seqused_k,
                block_table=page_table,
                softmax_scale=softmax_scale,
                causal=causal,
            )
            return out, None
        if q.dim() != 3:
            raise AssertionError("with cu_seqlens_q, q must be (total_q, nheads, headdim)")
        if page_table is not None:
            self.calls["varlen_paged"] += 1
            cu_seqlens_k = torch.cat([seqused_k.new_zeros(1), seqused_k.cumsum(0, dtype=torch.int32)])
            max_seqlen_k = max_seqlen_k if max_seqlen_k is not None else page_table.shape[1] * k.shape[1]
        else:
            if cu_seqlens_k is None:
                raise NotImplementedError("the flash-attn-4 double needs cu_seqlens_k without a page table")
            self.calls["varlen"] += 1
        max_seqlen_q = max_seqlen_q if max_seqlen_q is not None else q.shape[0]
        max_seqlen_k = max_seqlen_k if max_seqlen_k is not None else k.shape[0]
        out = self._math.flash_attn_varlen_func(
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_q,
            max_seqlen_k,
            softmax_scale=softmax_scale,
            causal=causal,
            block_table=page_table,
        )
        return out, None


def _unsupported(**flags) -> None:
    used = [name for name, is_set in flags.items() if is_set]
    if used:
        raise NotImplementedError(f"the flash-attn-4 test double does not implement {', '.join(used)}")
