"""The CPU executor's weights as it runs them, kept on disk and memory-mapped at later starts.

Loading a checkpoint for the CPU executor converts every tensor to the compute dtype, concatenates
q/k/v and gate/up (``fusion``) and packs each linear (``cpu_linear``): for SmolLM2-135M in bf16 that is
~0.3 s of a ~1.7 s warm start, redone at every start. ``load_packed_model`` saves the result once,
``<cache>/prepared/<model>-<dtype>-<key>.safetensors`` (safetensors bytes and ``cache_file``'s checksum
footer), and later starts map that file instead: no conversion and no copy, the pages come from the
page cache (shared by every process serving the model). Linears in the layout of the compiled kernels' linear are stored in it; oneDNN's packed
weights are opaque, so those linears are stored fused and converted and are reordered again at load.

The key covers the checkpoint files (path, size, modification time), the dtype, which kernel
layout the linears take (``cpu_linear.kernel_layout``), and the code that decides the layouts
(this file, ``fusion``, ``cpu_linear``, ``cpu_kernels``, ``block_codes``, ``llama``, and the C
linears that read them), so an edit to any of them starts a new file. At most
``KEEP_FILES`` files are kept, the least recently used going first. The checksum is checked at every
load (~16 ms for 325 MB on 2 cores; it faults in the pages the first step reads anyway): a damaged
file is rebuilt with one warning; one that cannot be written costs only the saving. Checkpoints under
``MIN_CHECKPOINT_BYTES`` prepare in milliseconds and get no file. The torch executor's
option ``prepared_weights_cache = false`` switches this off.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import time
from pathlib import Path

import torch
from torch import nn

from hetero_core.logging import get_logger
from hetero_core.cache import cache_file
from hetero_core.model.attention import AttentionBackend
from hetero_core.model.config import ModelConfig
from hetero_core.model.cpu.linear import PackedLinear, is_swiglu_projection, kernel_layout, pack_linears
from hetero_core.model.llama import LlamaForCausalLM
from hetero_core.model.loader import load_model
from hetero_core.model.source import resolve_model_source

log = get_logger("hetero.executor")

FORMAT_VERSION = 2  # 2: a checksum footer (cache_file) after the safetensors bytes
KEEP_FILES = 4  # prepared files kept in the cache; the least recently used beyond this are deleted
MIN_CHECKPOINT_BYTES = 32 << 20  # smaller checkpoints prepare in milliseconds: not worth a file
STALE_TMP_SECONDS = 3600  # a temporary file this old was left by a killed save
KERNEL_LAYOUT_SUFFIX = ".kernel_weight"  # a linear stored in the layout of the kernels' linear
_LAYOUT_MODULES = ("hetero_core.model.cpu.prepared_weights", "hetero_core.model.fusion", "hetero_core.model.cpu.linear",
                   "hetero_core.model.cpu.kernels", "hetero_core.model.cpu.kernel_linears",
                   "hetero_core.model.cpu.block_codes", "hetero_core.model.llama")
_LAYOUT_SOURCES = ("csrc/f32_linear.c", "csrc/bf16_linear.c")  # the kernels that read the packed layouts
_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool}


def pack_model(model: LlamaForCausalLM, kernels=None) -> None:
    """Pack ``model``'s linears for the CPU (the LM head too, untied from tied embeddings)."""
    model.untie_lm_head()
    pack_linears(model, kernels)


def load_packed_model(
    source: str | Path,
    cache_dir: Path,
    *,
    backend: AttentionBackend,
    dtype: torch.dtype,
    kernels=None,
) -> LlamaForCausalLM:
    """``load_model`` + ``pack_model``, mapped from the prepared file under ``cache_dir`` when there is
    one for this checkpoint, dtype and packing (and saved there when there is not)."""
    source = resolve_model_source(source)
    if sum(p.stat().st_size for p in _checkpoint_files(source)) < MIN_CHECKPOINT_BYTES:
        model = load_model(source, backend=backend, dtype=dtype)
        pack_model(model, kernels)
        return model
    path = prepared_path(source, cache_dir, dtype, kernels)
    try:
        model = _load_prepared(path, backend, kernels)
    except FileNotFoundError:
        model = None
    except cache_file.CacheFileInvalid as exc:
        cache_file.warn_rebuilding(exc)
        model = None
    if model is not None:
        _touch(path)
        log.info("executor.prepared_weights", path=str(path), hit=True)
        return model
    model = load_model(source, backend=backend, dtype=dtype)
    model.untie_lm_head()
    unpacked = model.state_dict()  # references: the plain weights of linears oneDNN will reorder
    pack_linears(model, kernels)
    _save_prepared(path, model, unpacked)
    log.info("executor.prepared_weights", path=str(path), hit=False)
    return model


def prepared_path(source: Path, cache_dir: Path, dtype: torch.dtype, kernels=None) -> Path:
    """Where the prepared weights of ``source`` (an HF directory or a .gguf file) in ``dtype`` live."""
    layout = [kernel_layout(kernels, dtype), getattr(kernels, "block_codes", False),
              getattr(kernels, "swiglu_pair_columns", None)]
    files = [_identity(p) for p in _checkpoint_files(source)]
    here = Path(__file__).parent
    code = [Path(importlib.util.find_spec(name).origin).read_bytes() for name in _LAYOUT_MODULES]
    code += [(here / name).read_bytes() for name in _LAYOUT_SOURCES]
    digest = hashlib.sha256(json.dumps([FORMAT_VERSION, cache_file.FOOTER, files, str(dtype), layout]).encode())
    for text in code:
        digest.update(text)
    dtype_name = str(dtype).removeprefix("torch.")
    return Path(cache_dir) / "prepared" / f"{source.name}-{dtype_name}-{digest.hexdigest()[:16]}.safetensors"


def _checkpoint_files(source: Path) -> list[Path]:
    if not source.is_dir():
        return [source]
    from hetero_core.model.safetensors_checkpoint import INDEX_FILE, safetensors_files

    index = [source / INDEX_FILE] if (source / INDEX_FILE).is_file() else []
    return [source / "config.json", *index, *safetensors_files(source)]


def _identity(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


def _save_prepared(path: Path, model: LlamaForCausalLM, unpacked: dict[str, torch.Tensor]) -> None:
    """Write ``model``'s tensors (packed ones in their layout, ``unpacked``'s for oneDNN's linears)
    to ``path`` atomically; a failure is logged, never raised."""
    from safetensors.torch import save_file

    tensors = {}
    for name, tensor in model.state_dict().items():
        tensors[name] = tensor
    for name, module in model.named_modules():
        if not isinstance(module, PackedLinear):
            continue
        if module.all_rows:
            tensors[name + KERNEL_LAYOUT_SUFFIX] = module.kernel_weight
        elif not (name == "lm_head" and model.config.tie_word_embeddings):  # tied: the embedding itself
            tensors[name + ".weight"] = unpacked[name + ".weight"]
    metadata = {"config": json.dumps(dataclasses.asdict(model.config)), "format": str(FORMAT_VERSION)}
    try:
        with cache_file.written_checked(path, ".tmp") as tmp:
            save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata=metadata)
    except (OSError, RuntimeError, ValueError) as exc:
        log.warning("executor.prepared_weights_not_saved", path=str(path), error=str(exc))
        return
    _prune(path.parent, keep=path)


def _load_prepared(path: Path, backend: AttentionBackend, kernels) -> LlamaForCausalLM:
    """The packed model from ``path``, its tensors views of the file's mapping (CacheFileInvalid when
    the file is damaged or unusable, FileNotFoundError when there is none)."""
    payload = cache_file.map_checked(path)
    try:
        metadata, tensors = _safetensors_views(payload)
        if metadata.get("format") != str(FORMAT_VERSION):
            raise ValueError(f"format {metadata.get('format')!r}, expected {FORMAT_VERSION}")
        raw = json.loads(metadata["config"])
        config = ModelConfig(**{**raw, "eos_token_ids": tuple(raw["eos_token_ids"])})
        return _assemble(config, tensors, backend, kernels)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise cache_file.CacheFileInvalid(path, f"unusable: {exc}") from None


def _safetensors_views(payload: torch.Tensor) -> tuple[dict, dict[str, torch.Tensor]]:
    """The metadata and tensors of the safetensors bytes ``payload``: views of it, nothing copied."""
    header_bytes = int.from_bytes(payload[:8].numpy().tobytes(), "little")
    header = json.loads(payload[8:8 + header_bytes].numpy().tobytes())
    metadata = header.pop("__metadata__", {})
    start = 8 + header_bytes
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        data = payload[start + begin:start + end]
        tensors[name] = data.view(_SAFETENSORS_DTYPES[entry["dtype"]]).view(entry["shape"])
    return metadata, tensors


def _assemble(config: ModelConfig, tensors: dict[str, torch.Tensor], backend, kernels) -> LlamaForCausalLM:
    with torch.device("meta"):
        model = LlamaForCausalLM(config, backend)
    if "lm_head" + KERNEL_LAYOUT_SUFFIX in tensors:
        model.untie_lm_head()
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            packed = tensors.get(name + KERNEL_LAYOUT_SUFFIX)
            if packed is not None and isinstance(child, nn.Linear):
                swiglu = is_swiglu_projection(parent, child_name)
                linear = PackedLinear.from_kernel_layout(packed, tensors.get(name + ".bias"), kernels, swiglu)
                setattr(parent, child_name, linear)
    plain = {k: v for k, v in tensors.items() if not k.endswith(KERNEL_LAYOUT_SUFFIX)}
    model.load_state_dict(plain, strict=False, assign=True)
    if model.lm_head is None:  # tied and not in the kernels' layout: share the loaded embedding
        model.untie_lm_head()
    pack_linears(model, kernels)  # the linears oneDNN packs (their plain weights were stored)
    left = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_meta]
    if left:
        raise ValueError(f"missing tensors {left[:3]}")
    model.requires_grad_(False)
    return model.eval()


def _touch(path: Path) -> None:
    try:
        os.utime(path)  # its modification time is when it was last used (for pruning)
    except OSError:
        pass


def _prune(folder: Path, keep: Path) -> None:
    """Delete the least recently used prepared files beyond ``KEEP_FILES`` (never ``keep``), and
    temporaries that killed saves left."""
    try:
        files = sorted(folder.glob("*.safetensors"), key=lambda p: p.stat().st_mtime, reverse=True)
        cutoff = time.time() - STALE_TMP_SECONDS
        stale = [p for p in folder.glob(".*.tmp") if p.stat().st_mtime < cutoff]
    except OSError:
        return
    for old in [p for p in files if p != keep][KEEP_FILES - 1:] + stale:
        try:
            old.unlink()
        except OSError:
            pass
