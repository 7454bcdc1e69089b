"""A model's paged KV cache: every layer's K/V in its attention backend's layout, addressed by block.

The engine's allocator hands out block numbers; this class moves whole blocks: within the cache
(``copy_blocks``, copy-on-write for the prefix cache) and to and from a CPU swap space
(``swap_out`` / ``swap_in``, swap preemption) and out of and into the cache of another engine
(``export_blocks`` / ``import_blocks``, prefill/decode disaggregation). Blocks lie along the
backend's ``kv_block_dim`` (0 unless the backend says otherwise).

What each layer holds per token comes from the model's architecture (``KVLayerSpec``: KV heads, key
and value widths, a value stored inside the key). A backend with ``allocate_kv_layers(layout, ...)``
allocates any layout; one with only ``allocate_kv_cache`` holds the plain one (every layer the
same heads, K and V the same width), and any other layout is refused by name.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hetero_core.errors import ModelLoadError
from hetero_core.model.attention import AttentionBackend, KVCache
from hetero_core.model.config import ModelConfig
from hetero_core.plugin_system.architectures import KVLayerSpec
from hetero_core.plugin_system.installed import architecture_of


class PagedKVCache:
    """``layers``: one ``KVCache`` per decoder layer; ``num_swap_blocks`` CPU blocks of swap space
    (pinned for a CUDA cache), none by default. ``layout``: one ``KVLayerSpec`` per layer (None:
    the one ``config``'s architecture gives)."""

    def __init__(
        self,
        backend: AttentionBackend,
        config: ModelConfig,
        *,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        num_swap_blocks: int = 0,
        layout: Sequence[KVLayerSpec] | None = None,
    ):
        self.device = device
        self.layout = tuple(layout if layout is not None else architecture_of(config).kv_layout(config))
        self.layers: list[KVCache] = allocate_layers(
            backend, self.layout, num_blocks, block_size, dtype, device
        )
        self.block_dim = getattr(backend, "kv_block_dim", 0)
        self.num_swap_blocks = num_swap_blocks
        self.swap_space = self._allocate_swap_space() if num_swap_blocks else None

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks within the cache (copy-on-write): ``(source, destination)`` pairs."""
        source, destination = _block_index(pairs, self.device)
        with torch.inference_mode():
            for cache in self.layers:
                for tensor in stored(cache):
                    tensor.index_copy_(
                        self.block_dim, destination, tensor.index_select(self.block_dim, source)
                    )

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Copy KV blocks to the CPU swap space: ``(device block, swap block)`` pairs."""
        source, _ = _block_index(pairs, self.device)
        _, destination = _block_index(pairs, torch.device("cpu"))
        with torch.inference_mode():
            for cache, swap in zip(self.layers, self._swap_space()):
                for tensor, swapped in zip(stored(cache), swap):
                    swapped.index_copy_(
                        self.block_dim, destination, tensor.index_select(self.block_dim, source).cpu()
                    )

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """Copy KV blocks back from the CPU swap space: ``(swap block, device block)`` pairs."""
        source, _ = _block_index(pairs, torch.device("cpu"))
        _, destination = _block_index(pairs, self.device)
        with torch.inference_mode():
            for cache, swap in zip(self.layers, self._swap_space()):
                for tensor, swapped in zip(stored(cache), swap):
                    blocks = swapped.index_select(self.block_dim, source).to(self.device)
                    tensor.index_copy_(self.block_dim, destination, blocks)

    def export_blocks(self, block_ids: list[int]) -> list[tuple[torch.Tensor, ...]]:
        """CPU copies of whole blocks, per layer its tensors with the blocks along ``block_dim`` in
        ``block_ids`` order (for a KV transfer to another engine)."""
        index = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        with torch.inference_mode():
            return [
                tuple(t.index_select(self.block_dim, index).cpu() for t in cache) for cache in self.layers
            ]

    def import_blocks(self, block_ids: list[int], layers: list[tuple[torch.Tensor, ...]]) -> None:
        """Write whole blocks exported by ``export_blocks`` (of a cache of the same model, dtype and
        block size) into ``block_ids``; ValueError, before writing anything, if they do not fit."""
        if len(layers) != len(self.layers):
            raise ValueError(
                f"KV blocks of {len(layers)} layers for a cache of {len(self.layers)}; "
                "both engines must run the same model"
            )
        for cache, tensors in zip(self.layers, layers):
            for tensor, blocks in zip(cache, tensors, strict=True):
                expected = list(tensor.shape)
                expected[self.block_dim] = len(block_ids)
                if list(blocks.shape) != expected or blocks.dtype != tensor.dtype:
                    raise ValueError(
                        f"KV blocks {blocks.dtype} {list(blocks.shape)} do not fit this cache "
                        f"({tensor.dtype} {expected}); both engines must run the same model, "
                        "dtype and block size"
                    )
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

        return [tuple(swap_like(t) for t in stored(cache)) for cache in self.layers]


def allocate_layers(
    backend: AttentionBackend,
    layout: tuple[KVLayerSpec, ...],
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> list[KVCache]:
    """One zeroed ``KVCache`` per layer of ``layout`` in ``backend``'s layout."""
    allocate_layouts = getattr(backend, "allocate_kv_layers", None)
    if allocate_layouts is not None:
        return allocate_layouts(layout, num_blocks, block_size, dtype, device)
    if layout and (not layout[0].is_plain or any(spec != layout[0] for spec in layout)):
        raise ModelLoadError(
            f"attention backend '{backend.name}' holds only K and V of one width, the same in every layer; "
            f"this model's KV layout is {sorted(set(layout), key=str)}; use an executor whose backend has "
            "allocate_kv_layers (the torch executor's does)"
        )
    spec = layout[0] if layout else KVLayerSpec(1, 1, 1)
    return backend.allocate_kv_cache(
        num_layers=len(layout),
        num_blocks=num_blocks,
        block_size=block_size,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.key_dim,
        dtype=dtype,
        device=device,
    )


def stored(cache: KVCache) -> tuple[torch.Tensor, ...]:
    """The tensors that hold a layer's cache: a value kept inside the key (``value_in_key``) is a view
    of the key, copied and swapped with it."""
    if (
        cache.value is None
        or cache.value.untyped_storage().data_ptr() == cache.key.untyped_storage().data_ptr()
    ):
        return (cache.key,)
    return (cache.key, cache.value)


def _block_index(pairs, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    index = torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)
    return index[:, 0].to(device), index[:, 1].to(device)
