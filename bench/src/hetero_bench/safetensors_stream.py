"""Writing a safetensors file one tensor at a time: making a checkpoint holds one tensor, not a shard.

``safetensors.torch.save_file`` takes every tensor of a file at once and copies them into one buffer
before writing, so a 2 GB shard of an 8B checkpoint costs 2-4 GB of RAM to write. The format is
simple (an 8-byte little-endian header size, a JSON header of name -> dtype, shape, data offsets,
padded with spaces to 8 bytes, then the tensors' bytes in offset order) and a random checkpoint's
shapes are known beforehand, so the header goes first and each tensor's bytes follow as it is made,
then it is dropped. ``plan_shards`` splits a checkpoint's tensors into files of at most
``max_bytes`` (a tensor larger than that gets a file of its own), in order, as HF checkpoints are.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from pathlib import Path

# torch dtype name -> (safetensors' code, bytes per element)
DTYPES = {"float32": ("F32", 4), "bfloat16": ("BF16", 2), "float16": ("F16", 2)}

Entry = tuple[str, tuple[int, ...]]  # a tensor's name and shape


def num_bytes(shape: tuple[int, ...], dtype: str) -> int:
    return math.prod(shape) * DTYPES[dtype][1]


def plan_shards(entries: list[Entry], dtype: str, max_bytes: int) -> list[list[Entry]]:
    """``entries`` cut, in order, into files of at most ``max_bytes`` (one tensor may exceed it alone)."""
    shards: list[list[Entry]] = [[]]
    size = 0
    for name, shape in entries:
        nbytes = num_bytes(shape, dtype)
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    return shards if shards[0] else []


def header_bytes(entries: list[Entry], dtype: str, metadata: dict[str, str]) -> bytes:
    """The file's size prefix and JSON header (padded to 8 bytes) for ``entries``, stored in order."""
    header: dict = {"__metadata__": metadata}
    offset = 0
    for name, shape in entries:
        end = offset + num_bytes(shape, dtype)
        header[name] = {"dtype": DTYPES[dtype][0], "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write_streamed(
    path: Path,
    entries: list[Entry],
    dtype: str,
    make: Callable[[str, tuple[int, ...]], object],
    metadata=None,
) -> None:
    """A safetensors file of ``entries``; ``make(name, shape)`` returns each tensor (a torch tensor of
    ``dtype`` and that shape), called once per tensor, in order, its result written and dropped."""
    import torch

    with open(path, "wb") as f:
        f.write(header_bytes(entries, dtype, metadata or {"format": "pt"}))
        for name, shape in entries:
            tensor = make(name, shape)
            if tuple(tensor.shape) != tuple(shape) or tensor.dtype != getattr(torch, dtype):
                raise ValueError(
                    f"{name}: made {tuple(tensor.shape)} {tensor.dtype}, the header says {shape} {dtype}"
                )
            f.write(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().data)
            del tensor
