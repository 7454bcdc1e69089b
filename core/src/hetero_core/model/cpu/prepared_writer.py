"""The prepared-weights file written a tensor at a time, as loading produces them, straight to disk.

A safetensors file is an 8-byte header length, a JSON header (each tensor's dtype, shape and byte
range), then the tensors' raw bytes. Which tensors a packed model has, and their shapes, are known
only once each linear is packed (a kernel layout, block codes, or oneDNN's plain weight), so the
header cannot be written first. Instead ``PreparedFileWriter`` leaves ``header_room`` bytes for it,
writes each tensor's bytes as it comes, and writes the header into that room at the end, padded with
spaces (as the format allows). Every tensor starts at a multiple of ``ALIGNMENT`` bytes (views of
the mapping need their dtype's alignment; AVX-512 loads like 64); the zero bytes before one are
listed as a ``PADDING_PREFIX`` uint8 tensor, so the bytes have no holes and the file stays valid
safetensors. Nothing is held in memory but the header's entries: the file is never assembled whole.
"""

from __future__ import annotations

import json
from typing import BinaryIO

import torch

from hetero_core.model.checkpoint_tensors import SAFETENSORS_DTYPES

ALIGNMENT = 64
PADDING_PREFIX = "__padding__."  # the filler before an aligned tensor (not a weight: loading skips it)
ENTRY_BYTES = 200  # room for one header entry beyond its name (dtype, a 4-d shape, two 20-digit offsets)
_DTYPE_NAMES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}


class HeaderTooLarge(ValueError):
    """The header needs more room than was left for it (``header_room`` too small: a bug)."""


def header_room(names, metadata: dict) -> int:
    """Bytes enough for the header of a file holding at most the tensors ``names`` (each with padding
    before it), such that the data starts aligned."""
    room = len(json.dumps(metadata)) + 2 * ALIGNMENT
    room += sum(2 * (len(name) + ENTRY_BYTES) for name in names)
    return room + (-(8 + room) % ALIGNMENT)


class PreparedFileWriter:
    """Safetensors bytes to ``file`` (opened for writing, at its start): ``add`` each tensor, then
    ``finish(metadata)`` once."""

    def __init__(self, file: BinaryIO, room: int):
        if (8 + room) % ALIGNMENT:
            raise ValueError(f"header room {room} does not leave the data aligned to {ALIGNMENT}")
        self.file, self.room = file, room
        self.entries: dict[str, dict] = {}
        self.offset = 0  # bytes of data written so far
        file.seek(8 + room)

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Write ``tensor``'s bytes (CPU) under ``name`` (OSError when the disk refuses them)."""
        if name in self.entries:
            raise ValueError(f"tensor {name!r} written twice")
        gap = -self.offset % ALIGNMENT
        if gap:
            self._write(f"{PADDING_PREFIX}{len(self.entries)}", "U8", [gap], bytes(gap))
        data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        self._write(name, _DTYPE_NAMES[tensor.dtype], list(tensor.shape), memoryview(data))

    def finish(self, metadata: dict[str, str]) -> None:
        """Write the header into its room (HeaderTooLarge when it does not fit) and leave the file
        positioned at its end."""
        header = json.dumps({"__metadata__": metadata, **self.entries}, separators=(",", ":")).encode()
        if len(header) > self.room:
            raise HeaderTooLarge(f"the header takes {len(header)} bytes, {self.room} were left for it")
        self.file.seek(0)
        self.file.write(self.room.to_bytes(8, "little") + header + b" " * (self.room - len(header)))
        self.file.seek(0, 2)
        self.file.flush()

    def _write(self, name: str, dtype: str, shape: list[int], data) -> None:
        size = len(data) if isinstance(data, bytes) else data.nbytes
        self.file.write(data)
        self.entries[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [self.offset, self.offset + size],
        }
        self.offset += size
