"""The attention kernels the cuda executor calls, and what they can do.

``FlashAttnKernels`` bundles flash-attn's two entry points with the capabilities the executor
checks at start-up (before loading weights), so an unsupported setting fails with one clear
message instead of a CUDA error inside a step:

- ``flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...,
  softmax_scale, causal, block_table)`` for steps with prefills,
- ``flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=..., block_table=...,
  softmax_scale, causal)`` for pure decode steps.

``loader.load_flash_attn`` finds flash-attn 2.x (``flash_attn``) first, else flash-attn-4
(``flash_attn.cute``, adapted to these two calls in ``flash_attn4.py``). flash-attn 2.x reads a
paged KV cache (``block_table``) only when a page holds a multiple of 256 tokens; flash-attn-4 takes
any page size, fastest at 128, on compute capability 9.x-11.x only. Another provider with the same
call signatures (a test double) declares its own limits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FlashAttnKernels:
    name: str  # e.g. "flash-attn 2.7.4"
    varlen: Callable  # flash_attn_varlen_func
    with_kvcache: Callable  # flash_attn_with_kvcache
    page_block_multiple: int  # paged KV needs block_size % page_block_multiple == 0
    dtypes: tuple[torch.dtype, ...]
    device_types: tuple[str, ...]
    max_head_dim: int = 256
    fast_block_size: int | None = None  # the page size its fastest path needs (the executor logs a hint)
    compute_capabilities: tuple[int, ...] | None = None  # CUDA majors it runs paged KV on; None: any

    def problems(
        self,
        *,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        head_dim: int,
        capability: tuple[int, int] | None = None,
    ) -> list[str]:
        """Reasons these kernels cannot run this configuration (empty when they can); ``capability``:
        the CUDA device's compute capability, None off CUDA."""
        reasons = []
        if block_size % self.page_block_multiple:
            fits = -(-block_size // self.page_block_multiple) * self.page_block_multiple
            reasons.append(
                f"block_size {block_size} is not a multiple of {self.page_block_multiple}, which "
                f"{self.name}'s paged KV cache requires; set block_size = {fits}"
            )
        if dtype not in self.dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in self.dtypes)
            reasons.append(
                f"executor.cuda.dtype {str(dtype).removeprefix('torch.')} is not supported by {self.name} "
                f"(supported: {names}); set executor.cuda.dtype = 'bfloat16'"
            )
        if device.type not in self.device_types:
            reasons.append(
                f"executor.cuda.device {str(device)!r}: {self.name} runs on {', '.join(self.device_types)} "
                "devices only; set executor.cuda.device = 'cuda'"
            )
        if head_dim > self.max_head_dim or head_dim % 8:
            reasons.append(
                f"the model's head_dim {head_dim} is not supported by {self.name} "
                f"(a multiple of 8, at most {self.max_head_dim})"
            )
        majors = self.compute_capabilities
        if capability is not None and majors and capability[0] not in majors:
            reasons.append(
                f"executor.cuda.device {str(device)!r} has compute capability "
                f"{capability[0]}.{capability[1]}; "
                f"{self.name}'s paged KV cache runs on {', '.join(f'{m}.x' for m in majors)} only; "
                "install flash-attn 2.x for this GPU"
            )
        return reasons
