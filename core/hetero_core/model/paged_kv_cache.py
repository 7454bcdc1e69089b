"""A model's paged KV cache: every layer's K/V in its attention backend's layout, addressed by block.

The engine's allocator hands out block numbers; this class moves whole blocks: within the cache
(``copy_blocks``, copy-on-write for the prefix cache) and to and from a CPU swap space
(``swap_out`` / ``swap_in``, swap preemption) and out of and into the cache of another engine
(``export_blocks`` / ``import_blocks``, prefill/decode disaggregation). Blocks lie along the backend's ``kv_block_dim``
(0 unless the backend says otherwise).
"""

from __future__ import annotations

import torch

from hetero_core.model.attention import AttentionBackend, KVCache
from hetero_core.model.config import ModelConfig


class PagedKVCache:
    """``layers``: one ``KVCache`` per decoder layer; ``num_swap_blocks`` CPU blocks of swap space
    (pinned for a CUDA cache), none by default."""

    def __init__(self, backend: AttentionBackend, config: ModelConfig, *, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device, num_swap_blocks: int = 0):
        self.device = device
        self.layers: list[KVCache] = backend.allocate_kv_cache(
            num_layers=config.num_hidden_layers,
            num_blocks=num_blocks,
            block_size=block_size,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            dtype=dtype,
            device=device,
        )
        self.block_dim = getattr(backend, "kv_block_dim", 0)
        self.num_swap_blocks = num_swap_blocks
        self.swap_space = self._allocate_swap_space() if num_swap_blocks else None

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks within the cache (copy-on-write): ``(source, destination)`` pairs."""
        source, destination = _block_index(pairs, self.device)
        with torch.inference_mode():
            for cache in self.layers:
                for tensor in cache:
                    tensor.index_copy_(self.block_dim, destination, tensor.index_select(self.block_dim, source))

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Copy KV blocks to the CPU swap space: ``(device block, swap block)`` pairs."""
        source, _ = _block_index(pairs, self.device)
        _, destination = _block_index(pairs, torch.device("cpu"))
        with torch.inference_mode():
            for cache, swap in zip(self.layers, self._swap_space()):
                for tensor, swapped in zip(cache, swap):
                    swapped.index_copy_(self.block_dim, destination, tensor.index_select(self.block_dim, source).cpu())

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """Copy KV blocks back from the CPU swap space: ``(swap block, device block)`` pairs."""
        source, _ = _block_index(pairs, torch.device("cpu"))
        _, destination = _block_index(pairs, self.device)
        with torch.inference_mode():
            for cache, swap in zip(self.layers, self._swap_space()):
                for tensor, swapped in zip(cache, swap):
                    blocks = swapped.index_select(self.block_dim, source).to(self.device)
                    tensor.index_copy_(self.block_dim, destination, blocks)

    def export_blocks(self, block_ids: list[int]) -> list[tuple[torch.Tensor, ...]]:
        """CPU copies of whole blocks, per layer its tensors with the blocks along ``block_dim`` in
        ``block_ids`` order (for a KV transfer to another engine)."""
        index = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        with torch.inference_mode():
            return [tuple(t.index_select(self.block_dim, index).cpu() for t in cache) for cache in self.layers]

    def import_blocks(self, block_ids: list[int], layers: list[tuple[torch.Tensor, ...]]) -> None:
        """Write whole blocks exported by ``export_blocks`` (of a cache of the same model, dtype and
        block size) into ``block_ids``; ValueError, before writing anything, if they do not fit."""
        if len(layers) != len(self.layers):
            raise ValueError(f"KV blocks of {len(layers)} layers for a cache of {len(self.layers)}; "
                             "both engines must run the same model")
        for cache, tensors in zip(self.layers, layers):
            for tensor, blocks in zip(cache, tensors, strict=True):
                expected = list(tensor.shape)
                expected[self.block_dim] = len(block_ids)
                if list(blocks.shape) != expected or blocks.dtype != tensor.dtype:
                    raise ValueError(f"KV blocks {blocks.dtype} {list(blocks.shape)} do not fit this cache "
                                     f"({tensor.dtype} {expected}); both engines must run the same model, "
                                     "dtype and block size")
        index = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        with torch.inference_mode():
            for cache, tensors in zip(self.layers, layers):
                for tensor, blocks in zip(cache, tensors):
                    tensor.index_copy_(self.block_dim, index, blocks.to(self.device))

    def free(self) -> None:
        """Drop every tensor (the cache is unusable afterwards)."""
        self.swap_space = None
        self.layers = []

    def _swap_space(self) -> list:
        if self.swap_space is None:
            raise ValueError("swap requested but the executor was built with num_swap_blocks = 0")
        return self.swap_space

    def _allocate_swap_space(self) -> list:
        """CPU tensors in the cache's layout with ``num_swap_blocks`` blocks, one tuple per layer."""
        pin = self.device.type == "cuda"

        def swap_like(tensor: torch.Tensor) -> torch.Tensor:
            shape = list(tensor.shape)
            shape[self.block_dim] = self.num_swap_blocks
            return torch.zeros(shape, dtype=tensor.dtype, pin_memory=pin)

        return [tuple(swap_like(t) for t in cache) for cache in self.layers]


def _block_index(pairs, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    index = torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)
    return index[:, 0].to(device), index[:, 1].to(device)
