"""A checkpoint's tensors as a lazy, read-only mapping: names known up front, each tensor read when
it is asked for and not kept.

Loading streams (``model_builder``): the builder takes one decoder layer's tensors at a time,
converts them and drops them, so at no moment are two copies of the weights in memory. This mapping
is what makes that possible: ``keys()``, shapes and sizes come from the files' headers; ``tensors[name]``
reads that tensor alone, and the caller owns the result (asking twice reads twice).

Safetensors shards are read with ``os.preadv`` straight into a fresh tensor, not memory-mapped:
pages of a mapping that were touched count in the process's resident memory for as long as any view
of the mapping lives (``safe_open`` maps each shard whole), so a mapped checkpoint would stay
resident beside the converted weights. Read this way only the tensor itself is resident; the file's
pages stay in the kernel's page cache. A GGUF file's tensors are dequantized one at a time
(``gguf_checkpoint.gguf_tensor``) and the pages of its mapping that tensor used are released after.
"""

from __future__ import annotations

import json
import math
import mmap
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from hetero_core.errors import ModelLoadError

SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
MAX_HEADER_BYTES = 100 << 20  # the safetensors format's own limit


class LazyTensors(Mapping):
    """Name -> CPU tensor, made on access by ``_read(name)``; the names (``_names``) known up front."""

    _names: dict[str, object]

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._names:
            raise KeyError(name)
        return self._read(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def _read(self, name: str) -> torch.Tensor:
        raise NotImplementedError


class CheckpointTensors(LazyTensors):
    """A checkpoint file's tensors: ``_names`` maps each name to its shape (from the file's header)."""

    def shape(self, name: str) -> tuple[int, ...]:
        """``name``'s shape, from the header: nothing read."""
        return self._names[name]

    def num_elements(self) -> int:
        """Elements over all tensors (for sizing what the weights become in another dtype)."""
        return sum(math.prod(shape) for shape in self._names.values())


class DerivedTensors(LazyTensors):
    """Tensors made on access from another lazy mapping's: ``derive(name)`` for each of ``names`` (a
    tensor-parallel rank's slices, ``tensor_parallel.shard_checkpoint``)."""

    def __init__(self, names: Iterable[str], derive: Callable[[str], torch.Tensor]):
        self._names, self._derive = dict.fromkeys(names), derive

    def _read(self, name: str) -> torch.Tensor:
        return self._derive(name)


@dataclass(frozen=True)
class _Stored:
    """Where one safetensors tensor's bytes are: ``path`` from byte ``start``, ``nbytes`` long."""

    path: Path
    dtype: torch.dtype
    start: int
    nbytes: int


class SafetensorsTensors(CheckpointTensors):
    """The tensors of safetensors ``files`` (a checkpoint's shards), each read alone on access."""

    def __init__(self, files: list[Path]):
        self._names, self._stored = {}, {}
        for path in files:
            for name, (shape, stored) in _read_header(path).items():
                self._names[name] = shape
                self._stored[name] = stored

    def dtype(self, name: str) -> torch.dtype:
        """``name``'s stored dtype, from the header: nothing read."""
        return self._stored[name].dtype

    def _read(self, name: str) -> torch.Tensor:
        stored = self._stored[name]
        tensor = torch.empty(self._names[name], dtype=stored.dtype)
        if stored.nbytes == 0:
            return tensor
        buffer = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
        try:
            with open(stored.path, "rb") as file:
                done = 0
                while done < stored.nbytes:  # a read may return less than asked (large reads, signals)
                    count = os.preadv(file.fileno(), [buffer[done:]], stored.start + done)
                    if count == 0:
                        raise OSError(f"file ends {stored.nbytes - done} bytes early in tensor {name!r}")
                    done += count
        except OSError as exc:
            raise ModelLoadError(f"cannot read {stored.path}: {exc}") from exc
        return tensor


def _read_header(path: Path) -> dict[str, tuple[tuple[int, ...], _Stored]]:
    """Each tensor of the safetensors file ``path``: its shape and where its bytes are (checked against
    the file's size; ModelLoadError naming the file when the header is not a safetensors one)."""

    def refuse(problem: str) -> ModelLoadError:
        return ModelLoadError(f"cannot read {path}: {problem}; re-download the model")

    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            header_bytes = int.from_bytes(file.read(8), "little")
            if size < 8 or header_bytes > min(size - 8, MAX_HEADER_BYTES):
                raise refuse(f"not a safetensors file ({size} bytes, header of {header_bytes})")
            header = json.loads(file.read(header_bytes))
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise refuse(f"its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise refuse("its header is not a JSON object")
    header.pop("__metadata__", None)
    data_start = 8 + header_bytes
    tensors = {}
    for name, entry in header.items():
        try:
            dtype = SAFETENSORS_DTYPES[entry["dtype"]]
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise refuse(f"tensor {name!r}: bad header entry {entry!r} ({exc!r})") from None
        nbytes = math.prod(shape) * dtype.itemsize
        if end - begin != nbytes or begin < 0 or data_start + end > size:
            raise refuse(f"tensor {name!r}: bytes {begin}..{end} do not hold {list(shape)} {entry['dtype']}")
        tensors[name] = (shape, _Stored(path, dtype, data_start + begin, nbytes))
    return tensors


class GGUFTensors(CheckpointTensors):
    """The tensors of an opened GGUF file under their Hugging Face names, each dequantized on access
    by ``dequantize(gguf_tensor)``."""

    def __init__(self, reader, hf_name: Callable[[str], str | None], dequantize: Callable):
        self._reader, self._dequantize = reader, dequantize
        self._names, self._tensors = {}, {}
        for tensor in reader.tensors:
            name = hf_name(tensor.name)
            if name is not None:
                self._names[name] = tuple(int(d) for d in reversed(tensor.shape.tolist()))
                self._tensors[name] = tensor

    def _read(self, name: str) -> torch.Tensor:
        tensor = self._tensors[name]
        result = self._dequantize(tensor)
        release_pages(self._reader, tensor)
        return result


def release_pages(reader, tensor) -> None:
    """Drop the pages of the GGUF's mapping that ``tensor``'s bytes are on from this process (they stay
    in the page cache; a later read faults them in again), so a file read whole is not kept resident."""
    mapping = getattr(reader.data, "_mmap", None)
    if not isinstance(mapping, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
        return  # not a mapping numpy made (a reader from another gguf version): nothing to release
    begin = int(tensor.data_offset) // mmap.PAGESIZE * mmap.PAGESIZE
    end = min(int(tensor.data_offset) + int(tensor.n_bytes), len(mapping))
    if end > begin:
        mapping.madvise(mmap.MADV_DONTNEED, begin, end - begin)
