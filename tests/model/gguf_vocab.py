"""The real tokenizer vocabularies of tests/data/gguf/vocab (llama.cpp's vocab-only GGUFs, xz-compressed;
README.md there): unpacked into a test's folder, their test cases with llama.cpp's token ids, and
copies with metadata changed or added (a chat template, another pre-tokenizer type)."""

from __future__ import annotations

import lzma
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from hetero_core.model.gguf_file import GGUFFile

VOCAB_DATA = Path(__file__).parents[1] / "data" / "gguf" / "vocab"
CASE_SEPARATOR = "\n__ggml_vocab_test__\n"  # llama.cpp's .inp format (tests/test-tokenizer-0.cpp)


def unpack_vocab(name: str, folder: Path) -> Path:
    """``<name>.gguf`` unpacked from its ``.xz`` into ``folder`` (once per folder)."""
    path = folder / f"{name}.gguf"
    if not path.exists():
        path.write_bytes(lzma.decompress((VOCAB_DATA / f"{name}.gguf.xz").read_bytes()))
    return path


def vocab_cases(inputs: str, outputs: str | None = None) -> list[tuple[str, list[int]]]:
    """llama.cpp's test cases: each text of ``<inputs>.gguf.inp`` with the ids of the same line of
    ``<outputs>.gguf.out`` (tokenized without BOS and without parsing special tokens)."""
    texts = (VOCAB_DATA / f"{inputs}.gguf.inp").read_text(encoding="utf-8").split(CASE_SEPARATOR)
    assert texts[-1] == "", "each case ends with the separator"
    lines = (VOCAB_DATA / f"{outputs or inputs}.gguf.out").read_text().splitlines()
    return [(text, [int(i) for i in line.split()]) for text, line in zip(texts[:-1], lines, strict=True)]


def gguf_fields(path: Path, prefix: str = "") -> dict[str, tuple[Any, gguf.GGUFValueType, Any]]:
    """The file's metadata under ``prefix``: key -> (value, GGUF type, array item type or None), read
    with Hetero's one-pass reader (gguf.GGUFReader takes ~10 s on a 128k-token vocabulary). The types
    of numbers are llama.cpp's for these keys: integers UINT32, reals FLOAT32."""
    fields = {}
    for key, field in GGUFFile(path).fields.items():
        if key.startswith(prefix):
            value = field.contents()
            if isinstance(field.value, np.ndarray):
                fields[key] = (value, gguf.GGUFValueType.ARRAY, _ARRAY_TYPES[field.value.dtype.name])
            elif isinstance(value, list):
                fields[key] = (value, gguf.GGUFValueType.ARRAY, _scalar_type(value[0]))
            else:
                fields[key] = (value, _scalar_type(value), None)
    return fields


_ARRAY_TYPES = {
    "int32": gguf.GGUFValueType.INT32,
    "uint32": gguf.GGUFValueType.UINT32,
    "float32": gguf.GGUFValueType.FLOAT32,
    "uint8": gguf.GGUFValueType.UINT8,
    "int8": gguf.GGUFValueType.INT8,
}


def fields_type(key: str, values: list) -> gguf.GGUFValueType:
    """The item type of an array: llama.cpp's INT32 for token types, else by the first item."""
    return gguf.GGUFValueType.INT32 if key.endswith("token_type") else _scalar_type(values[0])


def _scalar_type(value: Any) -> gguf.GGUFValueType:
    if isinstance(value, bool):
        return gguf.GGUFValueType.BOOL
    if isinstance(value, int):
        return gguf.GGUFValueType.UINT32
    if isinstance(value, float):
        return gguf.GGUFValueType.FLOAT32
    return gguf.GGUFValueType.STRING


def add_fields(writer: gguf.GGUFWriter, fields: dict[str, tuple[Any, gguf.GGUFValueType, Any]]) -> None:
    """Add ``gguf_fields``' metadata to ``writer``."""
    for key, (value, value_type, item_type) in fields.items():
        writer.add_key_value(key, value, value_type, sub_type=item_type)


def write_vocab_copy(source: Path, path: Path, **changes: Any) -> Path:
    """A vocab-only copy of ``source`` at ``path`` with ``changes`` (key -> a value, or None to leave the
    key out): a chat template added, the pre-tokenizer type changed, the merges damaged."""
    fields = {key: field for key, field in gguf_fields(source).items() if not key.startswith("GGUF.")}
    arch = fields.pop("general.architecture")[0]
    for key, value in changes.items():
        fields.pop(key, None)
        if isinstance(value, list):
            fields[key] = (value, gguf.GGUFValueType.ARRAY, fields_type(key, value))
        elif value is not None:
            fields[key] = (value, _scalar_type(value), None)
    writer = gguf.GGUFWriter(str(path), arch)
    add_fields(writer, fields)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def chat_template(name: str) -> str:
    """A model's chat template as llama.cpp keeps it (models/templates/<name>.jinja)."""
    return (VOCAB_DATA / f"{name}.jinja").read_text(encoding="utf-8")
