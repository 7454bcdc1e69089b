"""The CPU executor's weights as it runs them, kept on disk and memory-mapped at later starts.

Loading a checkpoint for the CPU executor converts every tensor to the compute dtype, concatenates
q/k/v and gate/up (``fusion``) and packs each linear (``cpu_linear``): for SmolLM2-135M in bf16 that is
~0.3 s of a ~1.7 s warm start, redone at every start. ``load_packed_model`` saves the result once,
``<cache>/prepared/<model>-<dtype>-<key>.safetensors`` (safetensors bytes and ``cache_file``'s checksum
footer), and later starts map that file instead: no conversion and no copy, the pages come from the
page cache (shared by every process serving the model). The file's format: ``prepared_file``.

The key covers the checkpoint files (path, size, modification time), the dtype, which kernel
layout the linears take (``cpu_linear.kernel_layout``), and the code that decides the layouts
(this file, ``prepared_file``, ``fusion``, ``linear``, ``kernels``, ``kernel_linears``, ``block_codes``,
``llama``, and the C linears that read them), so an edit to any of them starts a new file. At most
``KEEP_FILES`` files are kept, the least recently used going first. The checksum is checked at every
load (~16 ms for 325 MB on 2 cores; it faults in the pages the first step reads anyway): a damaged
file is rebuilt with one warning; one that cannot be written costs only the saving. Checkpoints under
``MIN_CHECKPOINT_BYTES`` prepare in milliseconds and get no file. The torch executor's
option ``prepared_weights_cache = false`` switches this off.

Loading streams (``model_builder``, ``layer_packing``): a miss packs (or, with the executor's
``quantization``, quantizes to int8: a file of its own) each layer as it is loaded and writes it to
the file at once, then frees the packed weights and maps the finished file as a hit
does, so memory never holds the weights twice. A file larger than the cache's room (the disk's free
space under the cache less ``RESERVED_DISK_BYTES``, ``prepared_room``) is not written: the model runs
without it, with one warning (``executor.prepared_weights_skipped``).
"""

from __future__ import annotations

import gc
import hashlib
import importlib.util
import json
import os
import shutil
import time
from pathlib import Path

import torch

from hetero_core.cache import cache_file
from hetero_core.logging import get_logger
from hetero_core.model.attention import AttentionBackend
from hetero_core.model.cpu.gguf_codes_loader import codes_source, load_codes_model
from hetero_core.model.cpu.int8_linear import Quantization
from hetero_core.model.cpu.layer_packing import LayerPacking, NotWritten, is_saved
from hetero_core.model.cpu.linear import kernel_layout, pack_linears
from hetero_core.model.cpu.packed_experts import pack_experts
from hetero_core.model.cpu.prepared_file import FORMAT_VERSION, load_prepared
from hetero_core.model.freed_memory import release_freed_memory
from hetero_core.model.gguf_cache import gguf_source
from hetero_core.model.llama import LlamaForCausalLM
from hetero_core.model.loader import load_model
from hetero_core.model.source import resolve_model_source

log = get_logger("hetero.executor")

KEEP_FILES = 4  # prepared files kept in the cache; the least recently used beyond this are deleted
MIN_CHECKPOINT_BYTES = 32 << 20  # smaller checkpoints prepare in milliseconds: not worth a file
RESERVED_DISK_BYTES = 2 << 30  # disk space a prepared file never takes (``prepared_room``)
STALE_TMP_SECONDS = 3600  # a temporary file this old was left by a killed save
_LAYOUT_MODULES = (
    "hetero_core.model.cpu.prepared_weights",
    "hetero_core.model.cpu.prepared_file",
    "hetero_core.model.cpu.prepared_writer",
    "hetero_core.model.cpu.layer_packing",
    "hetero_core.model.fusion",
    "hetero_core.model.cpu.linear",
    "hetero_core.model.cpu.kernels",
    "hetero_core.model.cpu.kernel_linears",
    "hetero_core.model.cpu.block_codes",
    "hetero_core.model.cpu.code_panels",
    "hetero_core.model.llama",
    "hetero_core.model.gguf_codes",
    "hetero_core.model.cpu.gguf_codes_loader",
    "hetero_core.model.cpu.gguf_code_linears",
    "hetero_core.model.cpu.split_linear",
    "hetero_core.model.cpu.int8_linear",
    "hetero_core.model.cpu.kernel_int8",
)
_LAYOUT_SOURCES = (
    "csrc/f32_linear.c",
    "csrc/bf16_linear.c",
    "csrc/int8_linear.c",
    "csrc/code_blocks.h",
)  # the kernels that read the packed layouts


def pack_model(model: LlamaForCausalLM, kernels=None) -> None:
    """Pack ``model``'s linears for the CPU (the LM head too, untied from tied embeddings), and its
    MoE experts for the kernels' linear (``packed_experts``)."""
    model.untie_lm_head()
    pack_experts(model, kernels)
    pack_linears(model, kernels)


def load_packed_model(
    source: str | Path,
    cache_dir: Path,
    *,
    backend: AttentionBackend,
    dtype: torch.dtype,
    kernels=None,
    prepared_file: bool = True,
    quantization: Quantization | None = None,
) -> LlamaForCausalLM:
    """``load_model`` + ``pack_model``, mapped from the prepared file under ``cache_dir`` when there is
    one for this checkpoint, dtype, packing and quantization (and saved there, as loading streams,
    when there is not and it fits: ``prepared_room``; never with ``prepared_file`` False). A GGUF (or
    a folder converted from one) whose linears the kernels take as codes loads from its codes
    (``gguf_codes_loader``), never expanding the model's weights, and streams into the file the same
    way; with ``quantization`` its weights are dequantized a layer at a time and quantized to int8 as
    they come, as any checkpoint's."""
    source = resolve_model_source(source)
    gguf = codes_source(source, dtype, kernels) if quantization is None else None

    def load(packing: LayerPacking) -> LlamaForCausalLM:  # a layer at a time, each group to ``packing``
        if gguf is not None:
            return load_codes_model(
                source, gguf, backend=backend, dtype=dtype, kernels=kernels, packing=packing
            )
        return load_model(source, backend=backend, dtype=dtype, on_group=packing)

    def streamed() -> LlamaForCausalLM:  # no prepared file
        return load(LayerPacking(kernels, None, quantization))

    small = sum(p.stat().st_size for p in _checkpoint_files(source)) < MIN_CHECKPOINT_BYTES
    if small or not prepared_file:
        return streamed()
    path = prepared_path(source, cache_dir, dtype, kernels, quantization)
    try:
        model = load_prepared(path, backend, kernels, quantization)
    except FileNotFoundError:
        model = None
    except cache_file.CacheFileInvalid as exc:
        cache_file.warn_rebuilding(exc)
        model = None
    if model is not None:
        _touch(path)
        log.info("executor.prepared_weights", path=str(path), hit=True)
        return model
    needed, room = prepared_bytes(source, dtype, quantization), prepared_room(path.parent)
    if needed > room:
        log.warning(
            "executor.prepared_weights_skipped",
            path=str(path),
            needed_bytes=needed,
            room_bytes=room,
            reason="the prepared file would not fit in the cache's free disk space: converted and packed "
            "at every start",
        )
        return streamed()
    return _load_and_save(load, streamed, path, backend=backend, kernels=kernels, quantization=quantization)


def _load_and_save(load, streamed, path: Path, *, backend, kernels, quantization) -> LlamaForCausalLM:
    """``load(packing)`` layer by layer, each layer written to the prepared file as it is packed; then
    the anonymous weights go and the model is mapped from the file, as a cache hit maps it (one copy in
    memory at every moment). A file that cannot be written costs only the saving."""
    model = None
    try:
        with cache_file.written_checked(path, ".tmp") as tmp, open(tmp, "wb") as file:
            packing = LayerPacking(kernels, file, quantization)
            model = load(packing)
            packing.finish(model)
            file.close()
            model = None  # before the checksum maps the file: its pages and these weights never both
            gc.collect()
            release_freed_memory()
    except (NotWritten, OSError) as exc:
        if model is not None and not is_saved(model):  # another architecture: packed at every load
            log.info("executor.prepared_weights", path=str(path), hit=False, saved=False)
            return model
        log.warning("executor.prepared_weights_not_saved", path=str(path), error=str(exc))
        if model is not None:
            return model
        return streamed()
    _prune(path.parent, keep=path)
    log.info("executor.prepared_weights", path=str(path), hit=False, saved=True)
    try:
        return load_prepared(path, backend, kernels, quantization)
    except (FileNotFoundError, cache_file.CacheFileInvalid) as exc:  # pruned or damaged by another process
        log.warning("executor.prepared_weights_not_saved", path=str(path), error=str(exc))
        return streamed()


def prepared_bytes(source: Path, dtype: torch.dtype, quantization: Quantization | None = None) -> int:
    """An upper bound on the prepared file's size: every checkpoint tensor in ``dtype`` (quantized: in
    the larger of that and an int8 code with its share of a scale and a group sum), and a tied LM head
    once more (packed beside the embedding). Reads the checkpoint's headers only."""
    from hetero_core.model.config import ModelConfig
    from hetero_core.model.loader import read_checkpoint
    from hetero_core.model.safetensors_checkpoint import read_safetensors

    converted_from = gguf_source(source) if source.is_dir() else None
    if converted_from is not None:  # a converted GGUF's weights are its GGUF's (converted or not yet)
        config, tensors = ModelConfig.from_dir(source), read_checkpoint(converted_from)[1]
    elif source.is_dir():  # (read_checkpoint would check a converted GGUF's weights: loading does that)
        config, tensors = ModelConfig.from_dir(source), read_safetensors(source)
    else:
        config, tensors = read_checkpoint(source)
    elements = tensors.num_elements()
    if config.tie_word_embeddings:
        elements += config.vocab_size * config.hidden_size
    itemsize = dtype.itemsize
    if quantization is not None:  # 1 byte a code, 4 + 4 bytes a group (4 inputs at the least)
        itemsize = max(itemsize, 1 + 8 / (quantization.group_size or 4))
    return int(elements * itemsize) + (64 << 20)  # the header, padding and footer: far less than this


def prepared_room(folder: Path) -> int:
    """Bytes the prepared file may take: the free space of the disk under ``folder`` less
    ``RESERVED_DISK_BYTES`` left for everything else (0 when that cannot be read)."""
    existing = Path(folder)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        free = shutil.disk_usage(existing).free
    except OSError:
        return 0
    return max(0, free - RESERVED_DISK_BYTES)


def prepared_path(
    source: Path, cache_dir: Path, dtype: torch.dtype, kernels=None, quantization: Quantization | None = None
) -> Path:
    """Where the prepared weights of ``source`` (an HF directory or a .gguf file) in ``dtype`` (and
    ``quantization``) live."""
    layout = [
        kernel_layout(kernels, dtype),
        getattr(kernels, "block_codes", False),
        getattr(kernels, "swiglu_pair_columns", None),
    ]
    quantized = quantization.key if quantization is not None else None
    source = resolve_model_source(source)
    files = [_identity(p) for p in _checkpoint_files(source)]
    here = Path(__file__).parent
    code = [Path(importlib.util.find_spec(name).origin).read_bytes() for name in _LAYOUT_MODULES]
    code += [(here / name).read_bytes() for name in _LAYOUT_SOURCES]
    digest = hashlib.sha256(
        json.dumps([FORMAT_VERSION, cache_file.FOOTER, files, str(dtype), layout, quantized]).encode()
    )
    for text in code:
        digest.update(text)
    dtype_name = str(dtype).removeprefix("torch.") + (f"-{quantization.method}" if quantization else "")
    return Path(cache_dir) / "prepared" / f"{source.name}-{dtype_name}-{digest.hexdigest()[:16]}.safetensors"


def _checkpoint_files(source: Path) -> list[Path]:
    if not source.is_dir():
        return [source]
    gguf = gguf_source(source)
    if gguf is not None:  # a converted GGUF: its weights (converted or not) are the GGUF's
        return [source / "config.json", gguf]
    from hetero_core.model.safetensors_checkpoint import INDEX_FILE, safetensors_files

    index = [source / INDEX_FILE] if (source / INDEX_FILE).is_file() else []
    return [source / "config.json", *index, *safetensors_files(source)]


def _identity(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


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
    for old in [p for p in files if p != keep][KEEP_FILES - 1 :] + stale:
        try:
            old.unlink()
        except OSError:
            pass
