"""The attention-backend seam: model code calls a backend, never a kernel.

A backend owns three things:

- the KV-cache layout (``allocate_kv_cache``),
- per-step metadata built once from the ``Batch`` (``build_metadata``): index tensors every layer
  shares,
- the per-layer operation (``forward``): write the new tokens' K/V at ``slot_mapping``, then attend
  each query token to its sequence's cached prefix plus the new tokens, causally.

The torch paged backend (``hetero_core.model.cpu.torch_attention``) is the reference; CUDA and Triton
executors provide their own backend and reuse the model code unchanged.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch

from hetero_core.engine.scheduling.batch import Batch


class KVCache(NamedTuple):
    """One layer's cache: ``key`` and ``value``, each ``[num_kv_heads, num_blocks, block_size, head_dim]``
    for the torch backend (other backends choose their own layout; a backend whose blocks are not
    along dimension 0 says which dimension in ``kv_block_dim``, for block copies and swap)."""

    key: torch.Tensor
    value: torch.Tensor


@runtime_checkable
class AttentionBackend(Protocol):
    name: str

    def allocate_kv_cache(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> list[KVCache]:
        """Return one zeroed ``KVCache`` per layer."""
        ...

    def build_metadata(self, batch: Batch, device: torch.device, upload: Any = None) -> Any:
        """Build the per-step index tensors (once per step, shared by all layers). ``upload``: the
        step's ``step_inputs.StepUpload``, holding the runner's arrays: add yours and call its
        ``upload()`` once (the step's one host-to-device copy); None: make your own."""
        ...

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: KVCache,
        metadata: Any,
        scale: float,
    ) -> torch.Tensor:
        """Store ``key``/``value`` in ``kv_cache`` and attend.

        ``query`` is ``[num_tokens, num_heads, head_dim]``; ``key``/``value`` are
        ``[num_tokens, num_kv_heads, head_dim]`` (flat, unpadded). Returns
        ``[num_tokens, num_heads, head_dim]``.
        """
        ...


class NoAttention:
    """The backend of a model loaded for its weights only (``load_model(path)`` without a backend):
    running it says so instead of failing somewhere inside."""

    name = "none"

    def allocate_kv_cache(self, *args, **kwargs):
        raise RuntimeError(self._message())

    def build_metadata(self, *args, **kwargs):
        raise RuntimeError(self._message())

    def forward(self, *args, **kwargs):
        raise RuntimeError(self._message())

    forward_latent = forward  # multi-head latent attention (model/mla) says the same

    @staticmethod
    def _message() -> str:
        return (
            "this model was loaded without an attention backend (weights only); pass backend= to "
            "load_model, e.g. hetero_core.model.cpu.torch_attention.TorchPagedAttention()"
        )
