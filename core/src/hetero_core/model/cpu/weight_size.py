"""How many bytes a checkpoint's weights take once the CPU executor holds them in a dtype, known before
any of them is read: from the parameter counts in the safetensors headers (or a GGUF's tensor infos).

``dtype = "auto"`` must not load a candidate that does not fit (an 8B model in fp32 is 32 GB; the
OOM killer ends the process without a word), and the KV cache is sized from what the weights leave.
The estimate: every parameter at the dtype's width (fp32 4 bytes, bf16 2), plus the LM head's own copy
where the checkpoint ties it to the embeddings (the executor unties it to pack it). A GGUF (or a
folder converted from one, which holds no weights of its own) whose linears are block codes runs them
as codes in fp32 and bf16 where the kernels take them (``block_codes``, ``gguf_codes_loader``), in
``code_panels``' layouts: per 32 weights 16 bytes of codes and f16 d and m (20) for Q4_0/Q4_1, 32 and
an f16 d (34) for Q8_0/Q5_0, 32 and fp32 d and m (40) for Q5_1/Q5_K; the k-quants' scales per
super-block of 256 inputs (Q4_K 0.59 bytes a weight, Q6_K 1.08); its other tensors (norms,
embeddings) at the dtype's width.
The headers are a few KB: reading them costs nothing next to the weights.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from hetero_core.errors import ModelLoadError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CODE_BYTES = {  # bytes per weight of the kernels' block-code panels (code_panels)
    **dict.fromkeys(("Q4_0", "Q4_1"), 20 / 32),
    **dict.fromkeys(("Q5_0", "Q8_0"), 34 / 32),
    **dict.fromkeys(("Q5_1", "Q5_K"), 40 / 32),
    "Q4_K": 2432 / 4096,  # per super-block and panel: fp32 d and m bases, 8-bit factors, the codes
    "Q6_K": 4416 / 4096,
}
_EMBEDDINGS = ("model.embed_tokens.weight", "token_embd.weight")


@dataclass(frozen=True)
class CheckpointTensors:
    """Elements per tensor (HF names) and, for a GGUF or a converted one, the GGUF file whose tensor
    types say which are block codes (read only when asked: stepping over a GGUF's tokenizer costs
    ~50 ms, which a warm start need not pay)."""

    elements: dict[str, int]
    tied_embeddings: bool
    gguf_source: Path | None = None

    @cached_property
    def code_types(self) -> dict[str, str]:
        """The GGUF type of each tensor by HF name ({} when the checkpoint is no GGUF's)."""
        if self.gguf_source is None:
            return {}
        try:
            return _gguf_types(self.gguf_source)
        except ModelLoadError:
            return {}

    @property
    def num_parameters(self) -> int:
        return sum(self.elements.values())

    def resident_bytes(self, dtype_name: str, block_codes: bool = False) -> int:
        """The weights' bytes in ``dtype_name`` as the executor holds them; ``block_codes``: fp32
        linears that are Q4_1/Q8_0 codes stay codes."""
        width = DTYPE_BYTES[dtype_name]
        codes = block_codes and dtype_name in ("float32", "bfloat16")
        total = 0.0
        for name, count in self.elements.items():
            code = self.code_types.get(name) if codes and name not in _EMBEDDINGS else None
            total += count * (CODE_BYTES[code] if code in CODE_BYTES else width)
        embedding = next((self.elements[n] for n in _EMBEDDINGS if n in self.elements), 0)
        if self.tied_embeddings:  # the head's untied copy (packed: codes where the table is codes)
            code = self.code_types.get("model.embed_tokens.weight") if codes else None
            total += embedding * (CODE_BYTES[code] if code in CODE_BYTES else width)
        return math.ceil(total)


def checkpoint_tensors(source: Path) -> CheckpointTensors:
    """The tensors of an HF directory (its safetensors headers) or a .gguf file (its tensor infos)."""
    source = Path(source)
    if not source.is_dir():
        return _gguf_tensors(source)
    converted_from = _converted_gguf_source(source)
    if converted_from is not None:  # a converted GGUF: its weights are the GGUF's
        return _gguf_tensors(converted_from)
    from hetero_core.model.safetensors_checkpoint import safetensors_files

    elements = {}
    for path in safetensors_files(source):
        elements.update(safetensors_elements(path))
    try:
        config = json.loads((source / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {source / 'config.json'}: {exc}") from exc
    tied = bool(config.get("tie_word_embeddings", False)) and "lm_head.weight" not in elements
    return CheckpointTensors(elements, tied, _converted_gguf_source(source))


def safetensors_elements(path: Path) -> dict[str, int]:
    """Elements of each tensor in a .safetensors file, from its header alone."""
    try:
        with open(path, "rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            if length > 100 << 20:
                raise ValueError(f"header length {length} is not plausible")
            header = json.loads(file.read(length))
        return {name: math.prod(info["shape"]) for name, info in header.items() if name != "__metadata__"}
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        raise ModelLoadError(f"cannot read the safetensors header of {path}: {exc}") from exc


def _gguf_tensors(path: Path) -> CheckpointTensors:
    from hetero_core.model.gguf_checkpoint import hf_tensor_name

    elements = {}
    for gguf_name, count, _ in gguf_tensor_infos(path):
        name = hf_tensor_name(gguf_name)
        if name is not None:
            elements[name] = count
    return CheckpointTensors(elements, "lm_head.weight" not in elements, path)  # no output.weight: tied


def _gguf_types(path: Path) -> dict[str, str]:
    from hetero_core.model.gguf_checkpoint import hf_tensor_name

    types = {}
    for gguf_name, _, type_id in gguf_tensor_infos(path):
        name = hf_tensor_name(gguf_name)
        if name is not None:
            types[name] = GGUF_TYPES.get(type_id, str(type_id))
    return types


GGUF_TYPES = {  # ggml type ids
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    30: "BF16",
}


def gguf_tensor_infos(path: Path) -> list[tuple[str, int, int]]:
    """(name, elements, ggml type id) of each tensor of a GGUF file (v2/v3), from its header: the
    metadata is stepped over, no tensor data is read (``gguf.GGUFReader`` parses every field: ~1 s
    for the embedded model's tokenizer on a loaded 2-core VM)."""
    import mmap

    from hetero_core.model.gguf_file import VERSIONS, HeaderCursor, tensor_info

    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            reader = HeaderCursor(memoryview(data))
            try:
                if bytes(reader.take(4)) != b"GGUF" or reader.number("<I") not in VERSIONS:
                    raise ValueError("not a GGUF v2/v3 file")
                num_tensors, num_fields = reader.number("<Q"), reader.number("<Q")
                for _ in range(num_fields):
                    reader.string()
                    reader.skip_value(reader.number("<I"))
                infos = []
                for _ in range(num_tensors):
                    name, dims, type_id, _ = tensor_info(reader)
                    infos.append((name, math.prod(dims), type_id))
                return infos
            finally:
                reader.view.release()
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"cannot read the GGUF header of {path}: {exc}") from exc


def _converted_gguf_source(folder: Path) -> Path | None:
    """For a converted GGUF (its manifest names the source file, when that is still there): that file."""
    from hetero_core.cache import cache_file

    if not (folder / cache_file.MANIFEST).is_file():
        return None
    try:
        source = Path(cache_file.read_manifest(folder)["source"])
    except (KeyError, TypeError, cache_file.CacheFileInvalid):
        return None
    return source if source.is_file() else None
