"""A GGUF file's metadata and tensor table, parsed in one quick pass over its header.

``gguf.GGUFReader`` makes a numpy view of every metadata item, two per string: the embedded model's
tokenizer (49,152 tokens and 48,900 merges) costs it 5-30 s on the shared 2-core VM, and a first start
opened the file three times (the conversion's config, the prepared file's size, the codes' load).
``GGUFFile`` reads the same header with ``struct`` (~0.1 s): the fields as Python values (a string
array as its raw bytes, decoded when asked for), the tensors as ``gguf.GGUFReader`` gives them (the
same names, types, shapes, offsets and numpy views of the mapped file, ``data`` the mapping), so
every reader of ``open_gguf`` takes either. A big-endian file is left to ``gguf.GGUFReader``.

The layout (GGUF v2/v3, little-endian): magic ``GGUF``, the version (u32), the tensor and field
counts (u64 each); each field a string key, a u32 value type and the value (a string is a u64 length
and its bytes; an array a u32 item type, a u64 count and the items); each tensor a string name, a
u32 dimension count, the dimensions (u64, the fastest-moving first), a u32 ggml type and a u64
offset into the data, which starts at the next multiple of ``general.alignment`` (32 when absent).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
SCALARS = {  # value type -> struct format (little-endian)
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
ARRAY_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8"}
ARRAY_DTYPES |= {11: "<i8", 12: "<f8"}
# ggml types whose tensors are viewed as their values (every other one as bytes, rows of blocks)
VALUE_DTYPES = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64}
VALUE_DTYPES |= {28: np.float64}


class BigEndian(Exception):
    """The file is a big-endian GGUF (``open_gguf`` hands it to ``gguf.GGUFReader``)."""


class GGUFField(NamedTuple):
    """One metadata field: its value as stored (a string array's items as bytes)."""

    name: str
    value: Any

    def contents(self) -> Any:
        """The value as ``gguf.ReaderField.contents()`` gives it: strings decoded, arrays as lists."""
        value = self.value
        if isinstance(value, bytes):
            return value.decode("utf-8")
        if isinstance(value, np.ndarray):
            return value.tolist()
        if isinstance(value, list):
            return [item.decode("utf-8") if isinstance(item, bytes) else item for item in value]
        return value

    def __len__(self) -> int:
        """The items of an array (1 for a scalar or a string)."""
        return len(self.value) if isinstance(self.value, (list, np.ndarray)) else 1


class GGUFTensor(NamedTuple):
    """One tensor, as ``gguf.ReaderTensor`` has it: ``shape`` in the file's order (inputs first),
    ``data`` a view of the mapping ([..., bytes per row] uint8 for block types), ``data_offset`` from
    the start of the file."""

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: np.ndarray
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray


class HeaderCursor:
    """A walk over a GGUF header in ``view`` from ``offset``: ``take`` bytes, ``number`` (a struct
    format), ``string`` (u64 length, bytes), ``skip_value`` (a field's value stepped over, unread).
    ValueError where the header runs past the end of the view."""

    def __init__(self, view: memoryview):
        self.view, self.offset = view, 0

    def take(self, size: int) -> memoryview:
        if self.offset + size > len(self.view):
            raise ValueError("the header runs past the end of the file")
        chunk = self.view[self.offset : self.offset + size]
        self.offset += size
        return chunk

    def number(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> bytes:
        return bytes(self.take(self.number("<Q")))

    def skip_value(self, type_id: int) -> None:
        if type_id in SCALARS:
            self.take(struct.calcsize(SCALARS[type_id]))
        elif type_id == STRING:
            self.take(self.number("<Q"))
        elif type_id == ARRAY:
            item, count = self.number("<I"), self.number("<Q")
            if item in SCALARS:
                self.take(struct.calcsize(SCALARS[item]) * count)
            else:
                for _ in range(count):
                    self.skip_value(item)
        else:
            raise ValueError(f"unknown metadata value type {type_id}")


class GGUFFile:
    """The parsed header of the GGUF at ``path`` and its mapping: ``fields`` (key -> ``GGUFField``),
    ``tensors`` (``GGUFTensor``s in file order), ``data`` (the file as a read-only ``np.memmap``).
    ValueError for a file that is not a GGUF v2/v3 or whose header runs past its end; ``BigEndian``
    for a big-endian one."""

    def __init__(self, path: str | Path):
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        self.path = Path(path)
        self.data = np.memmap(self.path, mode="r")
        view = memoryview(self.data)
        cursor = HeaderCursor(view)
        try:
            if bytes(cursor.take(4)) != b"GGUF":
                raise ValueError("not a GGUF file (no GGUF magic)")
            version = cursor.number("<I")
            if version not in VERSIONS:
                if struct.unpack("<I", struct.pack(">I", version))[0] in VERSIONS:
                    raise BigEndian(str(self.path))
                raise ValueError(f"GGUF version {version}; this reader takes {VERSIONS}")
            num_tensors, num_fields = cursor.number("<Q"), cursor.number("<Q")
            self.fields: dict[str, GGUFField] = {}
            for _ in range(num_fields):
                key = cursor.string().decode("utf-8")
                self.fields[key] = GGUFField(key, _value(cursor, cursor.number("<I")))
            infos = [tensor_info(cursor) for _ in range(num_tensors)]
            alignment = self.fields.get("general.alignment")
            align = DEFAULT_ALIGNMENT if alignment is None else int(alignment.value)
            if align <= 0 or align & (align - 1):
                raise ValueError(f"general.alignment {align} is not a power of two")
            start = -(-cursor.offset // align) * align
            self.tensors: list[GGUFTensor] = []
            seen = set()
            for name, dims, type_id, offset in infos:
                if name in seen:
                    raise ValueError(f"tensor {name!r} is listed twice")
                seen.add(name)
                ggml_type = GGMLQuantizationType(type_id)
                block, block_bytes = GGML_QUANT_SIZES[ggml_type]
                n_elements = int(np.prod(dims, dtype=np.int64)) if dims else 1
                n_bytes = n_elements * block_bytes // block
                shape = tuple(reversed(dims))
                if type_id in VALUE_DTYPES:
                    dtype, count = VALUE_DTYPES[type_id], n_elements
                else:  # rows of blocks, as bytes
                    dtype, count = np.uint8, n_bytes
                    shape = (*shape[:-1], shape[-1] // block * block_bytes) if shape else shape
                begin = start + offset
                if begin + n_bytes > len(self.data):
                    raise ValueError(f"tensor {name!r} runs past the end of the file")
                array = np.frombuffer(self.data, dtype=dtype, count=count, offset=begin).reshape(shape)
                self.tensors.append(
                    GGUFTensor(
                        name, ggml_type, np.array(dims, dtype=np.uint64), n_elements, n_bytes, begin, array
                    )
                )
        except (struct.error, UnicodeDecodeError) as exc:
            raise ValueError(f"its header is damaged: {exc}") from None
        finally:
            cursor.view = None
            view.release()


def _value(cursor: HeaderCursor, type_id: int) -> Any:
    if type_id in SCALARS:
        return cursor.number(SCALARS[type_id])
    if type_id == STRING:
        return cursor.string()
    if type_id != ARRAY:
        raise ValueError(f"unknown metadata value type {type_id}")
    item, count = cursor.number("<I"), cursor.number("<Q")
    if item in ARRAY_DTYPES:
        dtype = np.dtype(ARRAY_DTYPES[item])
        return np.frombuffer(cursor.take(dtype.itemsize * count), dtype=dtype).copy()
    if item == STRING:  # a vocabulary: a tight loop, decoded only if asked for
        view, offset, strings = cursor.view, cursor.offset, []
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            (length,) = unpack(view, offset)
            offset += 8
            strings.append(bytes(view[offset : offset + length]))
            offset += length
        if offset > len(view):
            raise ValueError("the header runs past the end of the file")
        cursor.offset = offset
        return strings
    return [_value(cursor, item) for _ in range(count)]


def tensor_info(cursor: HeaderCursor) -> tuple[str, list[int], int, int]:
    """The next tensor info of the header: its name, dimensions (the file's order), ggml type id and
    data offset (from the data's start)."""
    name = cursor.string().decode("utf-8")
    dims = [cursor.number("<Q") for _ in range(cursor.number("<I"))]
    return name, dims, cursor.number("<I"), cursor.number("<Q")
