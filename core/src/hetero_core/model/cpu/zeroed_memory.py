"""Zero-filled CPU tensors that cost nothing until they are written.

``torch.zeros`` writes every byte at once: for the default KV pool (1024 blocks of 16 tokens,
~750 MB for SmolLM2 in fp32) that is 0.2-1 s of a warm start spent touching pages most runs
never use. Anonymous memory maps are zero-filled by the kernel page by page on first touch, so
the tensor reads as zeros everywhere and only the pages written ever cost time or memory. The map
asks for transparent huge pages (``MADV_HUGEPAGE``, where the kernel offers them): a first write then
faults in 2 MiB at once instead of 4 KiB, which took ~45,000 page faults out of each of the first
benchmark rounds (the KV blocks cycle through the whole pool before any is reused).
"""

from __future__ import annotations

import math
import mmap

import torch


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor of ``shape`` backed by an anonymous memory map (kept alive by the tensor)."""
    num_bytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if num_bytes == 0:
        return torch.zeros(shape, dtype=dtype)
    buffer = mmap.mmap(-1, num_bytes)  # anonymous, private, readable and writable: zero-filled
    if hasattr(mmap, "MADV_HUGEPAGE"):  # Linux
        try:
            buffer.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel without transparent huge pages: 4 KiB pages, as before
            pass
    return torch.frombuffer(buffer, dtype=dtype).view(shape)
