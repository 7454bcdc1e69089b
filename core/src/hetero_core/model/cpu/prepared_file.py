"""The prepared-weights file: a packed model's tensors as safetensors bytes with ``cache_file``'s
checksum footer, written once as loading streams (``layer_packing``, ``prepared_writer``) and
memory-mapped at later starts (``prepared_weights`` decides when and where).

Linears in the layout of the compiled kernels' linear are stored in it as they run
(``<name>.kernel_weight``; the parts of a ``SplitLinear``, a GGUF's fused linear of mixed code
layouts, as ``<name>.kernel_parts.<i>``); oneDNN's packed weights are opaque, so those linears are
stored fused and converted and are reordered again at load. A quantized model's int8 linears are
stored as their codes, scales and (W8A8) group sums (``int8_linear.STORED_SUFFIXES``), its
quantization in the metadata. Loading builds the model on the meta device and assigns views of the
mapping: no conversion and no copy.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from hetero_core.cache import cache_file
from hetero_core.logging import get_logger
from hetero_core.model.attention import AttentionBackend
from hetero_core.model.checkpoint_tensors import SAFETENSORS_DTYPES
from hetero_core.model.config import ModelConfig
from hetero_core.model.cpu.int8_linear import STORED_CODES, STORED_SUFFIXES, Int8Linear, Quantization
from hetero_core.model.cpu.linear import PackedLinear, is_swiglu_projection, pack_linears
from hetero_core.model.cpu.prepared_writer import PADDING_PREFIX
from hetero_core.model.cpu.split_linear import PARTS_SUFFIX, SplitLinear
from hetero_core.model.llama import LlamaForCausalLM

log = get_logger("hetero.executor")

FORMAT_VERSION = 4  # 2: a checksum footer (cache_file); 3: tensors aligned, written streaming; 4: compact
# block-code layouts (code_panels: fp16 and super-block scales)
KERNEL_LAYOUT_SUFFIX = ".kernel_weight"  # a linear stored in the layout of the kernels' linear


def load_prepared(
    path: Path, backend: AttentionBackend, kernels, quantization: Quantization | None = None
) -> LlamaForCausalLM:
    """The packed model from ``path``, its tensors views of the file's mapping (CacheFileInvalid when
    the file is damaged or unusable, or was written for another ``quantization``; FileNotFoundError
    when there is none)."""
    payload = cache_file.map_checked(path)
    try:
        metadata, tensors = _safetensors_views(payload)
        if metadata.get("format") != str(FORMAT_VERSION):
            raise ValueError(f"format {metadata.get('format')!r}, expected {FORMAT_VERSION}")
        expected = json.dumps(quantization.key) if quantization is not None else None
        if metadata.get("quantization") != expected:
            raise ValueError(f"quantization {metadata.get('quantization')}, expected {expected}")
        raw = json.loads(metadata["config"])
        config = ModelConfig(**{**raw, "eos_token_ids": tuple(raw["eos_token_ids"])})
        return _assemble(config, tensors, backend, kernels)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise cache_file.CacheFileInvalid(path, f"unusable: {exc}") from None


def _safetensors_views(payload: torch.Tensor) -> tuple[dict, dict[str, torch.Tensor]]:
    """The metadata and tensors of the safetensors bytes ``payload``: views of it, nothing copied."""
    header_bytes = int.from_bytes(payload[:8].numpy().tobytes(), "little")
    header = json.loads(payload[8 : 8 + header_bytes].numpy().tobytes())
    metadata = header.pop("__metadata__", {})
    start = 8 + header_bytes
    tensors = {}
    for name, entry in header.items():
        if name.startswith(PADDING_PREFIX):
            continue
        begin, end = entry["data_offsets"]
        data = payload[start + begin : start + end]
        tensors[name] = data.view(SAFETENSORS_DTYPES[entry["dtype"]]).view(entry["shape"])
    return metadata, tensors


def _assemble(config: ModelConfig, tensors: dict[str, torch.Tensor], backend, kernels) -> LlamaForCausalLM:
    with torch.device("meta"):
        model = LlamaForCausalLM(config, backend)
    if "lm_head" + KERNEL_LAYOUT_SUFFIX in tensors or "lm_head" + STORED_CODES in tensors:
        model.untie_lm_head()
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if name + STORED_CODES in tensors and isinstance(child, nn.Linear):
                stored = {k: tensors.pop(name + k) for k in STORED_SUFFIXES if name + k in tensors}
                setattr(parent, child_name, Int8Linear.from_stored(stored, kernels))
                continue
            packed = tensors.get(name + KERNEL_LAYOUT_SUFFIX)
            parts = _split_parts(tensors, name)
            if parts and isinstance(child, nn.Linear):
                biases = [tensors.get(f"{name}.parts.{i}.bias") for i in range(len(parts))]
                setattr(parent, child_name, SplitLinear.from_kernel_layouts(parts, biases, kernels))
            elif packed is not None and isinstance(child, nn.Linear):
                swiglu = is_swiglu_projection(parent, child_name)
                linear = PackedLinear.from_kernel_layout(packed, tensors.get(name + ".bias"), kernels, swiglu)
                setattr(parent, child_name, linear)
    plain = {
        k: v for k, v in tensors.items() if not k.endswith(KERNEL_LAYOUT_SUFFIX) and PARTS_SUFFIX not in k
    }
    model.load_state_dict(plain, strict=False, assign=True)
    if model.lm_head is None:  # tied and not in the kernels' layout: share the loaded embedding
        model.untie_lm_head()
    pack_linears(model, kernels)  # the linears oneDNN packs (their plain weights were stored)
    left = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_meta]
    if left:
        raise ValueError(f"missing tensors {left[:3]}")
    model.requires_grad_(False)
    return model.eval()


def _split_parts(tensors: dict[str, torch.Tensor], name: str) -> list[torch.Tensor]:
    """A split linear's parts as stored (``<name>.kernel_parts.0``, ``.1``, ...), in order; [] for others."""
    parts = []
    while f"{name}{PARTS_SUFFIX}{len(parts)}" in tensors:
        parts.append(tensors[f"{name}{PARTS_SUFFIX}{len(parts)}"])
    return parts
