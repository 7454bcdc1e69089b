"""Load a GGUF for the CPU kernels straight from its codes: each linear packed from the file's blocks
into the coded linear's panels, no weight of the model ever expanded to fp32 or bf16.

The old way converted the GGUF once into an fp32 checkpoint and loaded that (for the 1B Q4_K_M file,
15.9 GB resident for 636 MiB of GGUF), then recovered the codes from the fp32 values where it could
(``block_codes``). Here the GGUF is memory-mapped (``gguf.GGUFReader``) and read one tensor at a time:

- a linear whose parts all have codes (``gguf_codes``: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K) is
  packed from them (``pack_code_panels``); the fused q/k/v and gate/up (``fusion``) are their parts'
  rows concatenated, gate/up in the kernels' SwiGLU panel order, a part with 8-bit codes widening the
  others to 8 bits; llama's q/k rows are un-permuted as codes (``reverse_permute``);
- any other linear (a part in Q6_K, F16, or a type without codes) is dequantized to the compute dtype
  and packed as a plain linear; a type Hetero keeps no codes for at all (IQ*, Q2_K, Q3_K, TQ*...) is
  named in one warning line;
- norms and embeddings are dequantized one by one to the compute dtype (a tied LM head keeps the
  embedding's codes).

The linears run the coded linear in either compute dtype (bf16 activations are widened to fp32 rows
for it); the dtype only picks how activations and attention run. The config and tokenizer still come
from the cached conversion (``gguf_cache``), which then holds no weights.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
from torch import nn

from hetero_core.errors import ModelLoadError
from hetero_core.logging import get_logger
from hetero_core.model.config import ModelConfig
from hetero_core.model.cpu.block_codes import PANEL, pack_code_panels
from hetero_core.model.fusion import checkpoint_parts
from hetero_core.model.gguf_checkpoint import (
    GGUF_ARCHITECTURES,
    gguf_config,
    hf_tensor_name,
    open_gguf,
    reverse_permute,
)
from hetero_core.model.gguf_codes import BlockCodes, codes_of, has_codes

log = get_logger("hetero.executor")

CHUNK_ROWS = 4096  # rows of one tensor decoded at a time (a multiple of the kernels' 16-row panels)
KERNEL_LAYOUT_SUFFIX = ".kernel_weight"  # as prepared_file names a linear in the kernels' layout
# Types dequantized without a warning: full-precision ones, and Q6_K until the kernels have its layout.
PLAIN_TYPES = {"F32", "F16", "BF16", "F64", "Q6_K"}


def codes_source(source: Path, dtype: torch.dtype, kernels) -> Path | None:
    """The GGUF to load ``source`` (a .gguf file, or a folder converted from one) from as codes, or
    None where this path does not apply: no compiled kernels, ``block_code_weights`` off (the kernels'
    ``block_codes``), a compute dtype other than fp32 and bf16, or not a GGUF."""
    from hetero_core.model.gguf_cache import gguf_source

    if kernels is None or not getattr(kernels, "block_codes", False):
        return None
    if dtype not in (torch.float32, torch.bfloat16):
        return None
    source = Path(source)
    if source.is_file() and source.suffix == ".gguf":
        return source
    return gguf_source(source) if source.is_dir() else None


def load_codes_model(
    source: Path, gguf_path: Path, *, backend, dtype: torch.dtype, kernels, num_layers: int | None = None
) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The packed model of ``gguf_path`` (the config from ``source``'s config.json where it is a
    converted folder) and its plain tensors (those ``prepared_file.save_prepared`` stores for linears
    outside the kernels' layout). ``num_layers``: only the first decoder layers (with the embedding,
    the final norm and the head), as ``dtype = "auto"``'s probe times them (``probe_model``)."""
    from hetero_core.model.cpu.prepared_file import _assemble

    reader = open_gguf(gguf_path)
    raw_config = gguf_config(reader, gguf_path)
    config = ModelConfig.from_dir(source) if Path(source).is_dir() else ModelConfig.from_dict(raw_config)
    if config.architecture not in GGUF_ARCHITECTURES.values():
        raise ModelLoadError(f"{gguf_path}: architecture {config.architecture} cannot load from GGUF codes")
    if num_layers is not None:
        config = dataclasses.replace(config, num_hidden_layers=num_layers)
    by_name = {}
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name)
        if name is not None and (num_layers is None or _layer_index(name) < num_layers):
            by_name[name] = tensor
    tensors, skipped = _tensors(by_name, config, dtype, kernels, raw_config["model_type"] == "llama")
    _warn_expanded(skipped)
    try:
        model = _assemble(config, tensors, backend, kernels)
    except (ValueError, RuntimeError) as exc:
        raise ModelLoadError(
            f"{gguf_path} does not match its architecture {config.architecture}: {exc}"
        ) from exc
    in_kernel_layout = {f"{n}.weight" for n, m in model.named_modules() if getattr(m, "all_rows", False)}
    plain = {
        k: v for k, v in tensors.items() if not k.endswith(KERNEL_LAYOUT_SUFFIX) and k not in in_kernel_layout
    }
    return model, plain  # (dequantized linears now packed are dropped: their plain copy goes)


def _layer_index(name: str) -> int:
    """The decoder layer of an HF tensor name (-1: not a layer's: embedding, final norm, head)."""
    parts = name.split(".")
    return int(parts[2]) if name.startswith("model.layers.") else -1


def _tensors(by_name: dict, config: ModelConfig, dtype: torch.dtype, kernels, unpermute: bool):
    """``prepared_file``'s tensors for the model: linears as packed codes where their parts have them
    (``<name>.kernel_weight``), every other tensor dequantized to ``dtype``; and the tensors of types
    kept without codes (type -> names). ``unpermute``: q/k rows are llama.cpp's permuted ones."""
    permuted = _permuted_heads(by_name, config) if unpermute else {}
    from hetero_core.model.attention import NoAttention
    from hetero_core.model.llama import LlamaForCausalLM

    with torch.device("meta"):
        skeleton = LlamaForCausalLM(config, NoAttention())
    skeleton.untie_lm_head()
    linears = {name for name, module in skeleton.named_modules() if isinstance(module, nn.Linear)}
    expected = [
        n for n in skeleton.state_dict() if n.rpartition(".")[0] not in linears or n.endswith(".bias")
    ]
    tensors: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    skipped: dict[str, list[str]] = {}
    for linear in sorted(linears):
        parts = _parts(linear, config)
        missing = [part for part, _ in parts if part not in by_name]
        if missing:
            raise ModelLoadError(f"this GGUF has no tensor for {missing[0]}; is it a whole model?")
        for part, _ in parts:
            type_name = by_name[part].tensor_type.name
            if not has_codes(type_name) and type_name not in PLAIN_TYPES:
                skipped.setdefault(type_name, []).append(by_name[part].name)
        swiglu = linear.endswith("gate_up_proj")
        packed = _packed_codes(by_name, parts, permuted, kernels, swiglu)
        if packed is not None:
            tensors[linear + KERNEL_LAYOUT_SUFFIX] = packed
        elif linear != "lm_head" or not config.tie_word_embeddings:  # tied: the embedding itself
            tensors[linear + ".weight"] = _dequantized(by_name, parts, permuted, dtype)
        used.update(part for part, _ in parts)
    for name in expected:
        parts = checkpoint_parts(name, config) or [(name, None)]
        missing = [part for part, _ in parts if part not in by_name]
        if missing and name.endswith(".bias"):
            continue  # a linear without a bias: the module's own bias is None then
        if missing:
            raise ModelLoadError(f"this GGUF has no tensor for {missing[0]}; is it a whole model?")
        tensors[name] = _dequantized(by_name, parts, permuted, dtype)
        used.update(part for part, _ in parts)
    unexpected = sorted(set(by_name) - used)
    if unexpected:
        raise ModelLoadError(
            f"this GGUF holds tensors {config.architecture} does not take: {unexpected[:5]} "
            f"({len(unexpected)} in all)"
        )
    return tensors, skipped


def _parts(linear: str, config: ModelConfig) -> list[tuple[str, int | None]]:
    """A model linear's checkpoint tensors (a tied LM head's: the embedding), in row order."""
    if linear == "lm_head" and config.tie_word_embeddings:
        return [("model.embed_tokens.weight", None)]
    return checkpoint_parts(linear + ".weight", config) or [(linear + ".weight", None)]


def _packed_codes(by_name, parts, permuted: dict[str, int], kernels, swiglu: bool) -> torch.Tensor | None:
    """The parts' codes packed for ``coded_linear`` (rows concatenated, in the SwiGLU order for
    gate/up), or None where a part has none or the rows do not fill the kernels' panels."""
    if len(parts) == 1 and not swiglu and parts[0][0] not in permuted:
        return _packed_in_chunks(by_name[parts[0][0]])
    codes = []
    for part, _ in parts:
        tensor = by_name[part]
        found = codes_of(tensor.data, tensor.tensor_type.name) if tensor.data.ndim == 2 else None
        if found is None:
            return None
        codes.append(_unpermuted(found, permuted.get(part)))
    rows = sum(c.shape[0] for c in codes)
    if rows % (2 * PANEL if swiglu else PANEL):
        return None
    if len({c.bits for c in codes}) > 1:
        codes = [c.widened() for c in codes]
    d = torch.from_numpy(np.concatenate([c.d for c in codes]))
    m = torch.from_numpy(np.concatenate([c.m for c in codes]))
    q = torch.from_numpy(np.concatenate([c.q for c in codes]))
    if swiglu:
        d, m, q = (kernels.swiglu_order(t) for t in (d, m, q))
    return pack_code_panels(d, m, q, codes[0].bits)


def _packed_in_chunks(tensor) -> torch.Tensor | None:
    """One tensor's codes packed ``CHUNK_ROWS`` rows at a time (the LM head's codes alone are ~1 byte a
    weight before packing), or None as for ``_packed_codes``."""
    raw, type_name = tensor.data, tensor.tensor_type.name
    if raw.ndim != 2 or not has_codes(type_name) or raw.shape[0] % PANEL:
        return None
    out = None
    for start in range(0, raw.shape[0], CHUNK_ROWS):
        codes = codes_of(raw[start : start + CHUNK_ROWS], type_name)
        d, m, q = (torch.from_numpy(t) for t in (codes.d, codes.m, codes.q))
        packed = pack_code_panels(d, m, q, codes.bits)
        if out is None:
            out = torch.empty((raw.shape[0] // PANEL, *packed.shape[1:]), dtype=packed.dtype)
        out[start // PANEL : start // PANEL + packed.shape[0]] = packed
    return out


def _unpermuted(codes: BlockCodes, heads: int | None) -> BlockCodes:
    if heads is None:
        return codes
    d, m, q = (reverse_permute(t, heads) for t in (codes.d, codes.m, codes.q))
    return BlockCodes(d, m, q, codes.bits)


def _permuted_heads(by_name: dict, config: ModelConfig) -> dict[str, int]:
    """llama.cpp stores llama's q/k rows permuted for its RoPE: each such tensor -> the heads to undo
    it over (``reverse_permute``)."""
    heads = {}
    for name in by_name:
        if ".self_attn.q_proj." in name:
            heads[name] = config.num_attention_heads
        elif ".self_attn.k_proj." in name:
            heads[name] = config.num_key_value_heads
    return heads


def _dequantized(by_name, parts, permuted: dict[str, int], dtype: torch.dtype) -> torch.Tensor:
    """The parts dequantized (un-permuted like the codes) and concatenated, in ``dtype``: ``CHUNK_ROWS``
    rows at a time into the result (never a whole fp32 copy of an embedding)."""
    from gguf.quants import dequantize

    tensors = [by_name[part] for part, _ in parts]
    if tensors[0].data.ndim == 1:  # norms, biases
        return torch.cat([torch.from_numpy(np.asarray(t.data, dtype=np.float32).copy()) for t in tensors]).to(
            dtype
        )
    columns = [int(t.shape[0]) for t in tensors]  # GGUF shapes list the inputs first
    if len(set(columns)) > 1:
        raise ModelLoadError(f"the parts of a fused linear disagree on its inputs: {[p for p, _ in parts]}")
    out = torch.empty((sum(int(t.shape[1]) for t in tensors), columns[0]), dtype=dtype)
    row = 0
    for (part, _), tensor in zip(parts, tensors, strict=True):
        rows = int(tensor.shape[1])
        step = rows if part in permuted else CHUNK_ROWS  # a permutation spans the whole tensor
        for start in range(0, rows, step):
            values = dequantize(tensor.data[start : start + step], tensor.tensor_type)
            values = np.asarray(values, dtype=np.float32).reshape(-1, columns[0])
            if not values.flags.writeable:  # a view of the mapped file (F32): torch wants its own
                values = values.copy()
            if part in permuted:
                values = reverse_permute(values, permuted[part])
            out[row + start : row + start + values.shape[0]] = torch.from_numpy(np.ascontiguousarray(values))
        row += rows
    return out


def _warn_expanded(skipped: dict[str, list[str]]) -> None:
    """One line per type the GGUF stores that Hetero keeps without codes."""
    for type_name, names in sorted(skipped.items()):
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        log.warning(
            "executor.gguf_type_expanded",
            problem=f"this GGUF stores {names[0]}{more} as {type_name}, which Hetero keeps as "
            "weights dequantized to the compute dtype (2-4 bytes a weight, not codes)",
            fix="use a Q4_K_M, Q5_K_M or Q8_0 file to keep them as codes",
        )
