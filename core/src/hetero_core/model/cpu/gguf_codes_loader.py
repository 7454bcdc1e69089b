"""Load a GGUF for the CPU kernels straight from its codes: each linear packed from the file's blocks
into the coded linear's panels, no weight of the model ever expanded to fp32 or bf16.

The old way converted the GGUF once into an fp32 checkpoint and loaded that (for the 1B Q4_K_M file,
15.9 GB resident for 636 MiB of GGUF), then recovered the codes from the fp32 values where it could
(``block_codes``). Here the GGUF is memory-mapped (``open_gguf``: ``gguf_file.GGUFFile``) and read one
tensor at a time:

- a linear whose parts all have codes (``gguf_codes``: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)
  is packed from them (``gguf_code_linears``: fused parts of one layout as one weight, parts of Q6_K's
  16-input blocks beside 32-input ones as a ``SplitLinear``), so a Q4_K_M or Q5_K_M file keeps every
  linear as codes;
- any other linear (a part in F16, or a type without codes) is dequantized to the compute dtype and
  packed as a plain linear; a type Hetero keeps no codes for at all (IQ*, Q2_K, Q3_K, TQ*...) is named
  in one warning line;
- norms and embeddings are dequantized one by one to the compute dtype (a tied LM head keeps the
  embedding's codes).

Loading streams as a checkpoint's does (``model_builder``): a decoder layer at a time (then the
embedding, final norm and head), each group handed to ``LayerPacking`` once in place, which packs what
is left plain and, given a prepared file, writes the group to it at once. The GGUF pages a tensor was
read from are released after it (``checkpoint_tensors.release_pages``), so a first start holds the
packed codes, the layer in hand and nothing else.

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
from hetero_core.model.checkpoint_tensors import release_pages
from hetero_core.model.config import ModelConfig
from hetero_core.model.cpu import gguf_code_linears
from hetero_core.model.cpu.gguf_code_linears import coded_linear
from hetero_core.model.cpu.layer_packing import LayerPacking
from hetero_core.model.freed_memory import release_freed_memory
from hetero_core.model.fusion import checkpoint_parts
from hetero_core.model.gguf_checkpoint import (
    GGUF_ARCHITECTURES,
    gguf_config,
    hf_tensor_name,
    open_gguf,
    reverse_permute,
)
from hetero_core.model.gguf_codes import has_codes
from hetero_core.model.llama import LlamaForCausalLM
from hetero_core.model.model_builder import weight_groups

log = get_logger("hetero.executor")

PLAIN_TYPES = {"F32", "F16", "BF16", "F64"}  # types dequantized without a warning: full-precision ones


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
    source: Path,
    gguf_path: Path,
    *,
    backend,
    dtype: torch.dtype,
    kernels,
    num_layers: int | None = None,
    packing: LayerPacking | None = None,
) -> LlamaForCausalLM:
    """The packed model of ``gguf_path`` (the config from ``source``'s config.json where it is a
    converted folder), loaded a layer at a time, each group handed to ``packing`` (a ``LayerPacking``
    for ``kernels``, writing a prepared file where it has one; a fresh one without a file if None).
    ``num_layers``: only the first decoder layers (with the embedding, the final norm and the head),
    as ``dtype = "auto"``'s probe times them (``probe_model``)."""
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
    # The metadata is read: its fields (a tokenizer's every token and merge; with gguf.GGUFReader, each
    # as numpy views: ~120 MB of Python objects for a 49k vocabulary) would stay beside the weights.
    reader.fields.clear()
    with torch.device("meta"):
        model = LlamaForCausalLM(config, backend)
    loader = _GroupLoader(reader, by_name, config, dtype, kernels, raw_config["model_type"] == "llama")
    packing = packing if packing is not None else LayerPacking(kernels)
    try:
        for prefix, names in weight_groups(loader.names):
            loader.load(model, names)
            packing(model, prefix)
            release_freed_memory()  # the group's decoded codes and dequantized copies
    except (ValueError, RuntimeError) as exc:  # shapes that are not the config's
        raise ModelLoadError(
            f"{gguf_path} does not match its architecture {config.architecture}: {exc}"
        ) from exc
    left = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_meta]
    if left:
        raise ModelLoadError(f"{gguf_path}: no tensor loaded for {left[:3]}; is it a whole model?")
    model.requires_grad_(False)
    return model.eval()


def _layer_index(name: str) -> int:
    """The decoder layer of an HF tensor name (-1: not a layer's: embedding, final norm, head)."""
    parts = name.split(".")
    return int(parts[2]) if name.startswith("model.layers.") else -1


class _GroupLoader:
    """The model's tensors from the GGUF a group at a time. ``names``: the module's linears (as
    ``<linear>.weight``) and its other tensors, checked against the file up front (nothing read);
    ``load(model, names)`` puts one group of them in place, each linear as codes where its parts have
    them (``gguf_code_linears``), everything else dequantized to ``dtype``. ``unpermute``: q/k rows
    are llama.cpp's permuted ones."""

    def __init__(self, reader, by_name: dict, config: ModelConfig, dtype: torch.dtype, kernels, unpermute):
        from hetero_core.model.attention import NoAttention

        self.reader, self.by_name, self.config, self.dtype, self.kernels = (
            reader,
            by_name,
            config,
            dtype,
            kernels,
        )
        self.permuted = _permuted_heads(by_name, config) if unpermute else {}
        with torch.device("meta"):
            skeleton = LlamaForCausalLM(config, NoAttention())
        skeleton.untie_lm_head()
        self.shapes = {
            n: tuple(m.weight.shape) for n, m in skeleton.named_modules() if isinstance(m, nn.Linear)
        }
        self.biased = {
            n for n, m in skeleton.named_modules() if isinstance(m, nn.Linear) and m.bias is not None
        }
        others = [n for n in skeleton.state_dict() if n.rpartition(".")[0] not in self.shapes]
        self.names = [f"{linear}.weight" for linear in sorted(self.shapes)] + others
        self._check()

    def load(self, model: LlamaForCausalLM, names: list[str]) -> None:
        tensors, read = {}, []
        for name in names:
            linear = name.rpartition(".")[0]
            if linear in self.shapes:
                self._linear(model, linear, tensors)
                read += [p for p, _ in _parts(linear, self.config)]
            else:
                tensors[name] = self._plain(name)
                read += [p for p, _ in _tensor_parts(name, self.config)]
        result = model.load_state_dict(tensors, strict=False, assign=True)
        if result.unexpected_keys:
            raise ValueError(f"tensors the module does not have: {result.unexpected_keys[:3]}")
        for part in read:  # the pages of the mapping they were read from: back to the page cache
            release_pages(self.reader, self.by_name[part])

    def _linear(self, model: LlamaForCausalLM, linear: str, tensors: dict) -> None:
        parts = _parts(linear, self.config)
        bias = self._plain(f"{linear}.bias") if linear in self.biased else None
        module = coded_linear(
            [self.by_name[p] for p, _ in parts],
            [self.permuted.get(p) for p, _ in parts],
            bias,
            self.kernels,
            linear.endswith("gate_up_proj"),
        )
        if module is not None:
            if (module.out_features, module.in_features) != self.shapes[linear]:
                raise ValueError(
                    f"{linear}'s codes are [{module.out_features}, {module.in_features}], the config's "
                    f"linear {list(self.shapes[linear])}"
                )
            parent, _, child = linear.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, module)
        elif linear != "lm_head" or not self.config.tie_word_embeddings:  # tied: the embedding itself
            tensors[f"{linear}.weight"] = _dequantized(self.by_name, parts, self.permuted, self.dtype)
            if bias is not None:
                tensors[f"{linear}.bias"] = bias

    def _plain(self, name: str) -> torch.Tensor:
        return _dequantized(self.by_name, _tensor_parts(name, self.config), self.permuted, self.dtype)

    def _check(self) -> None:
        """Every tensor the module takes is in the file and the file holds no other (ModelLoadError);
        one warning per type kept without codes."""
        used, skipped = set(), {}
        wanted = [*self.names, *(f"{linear}.bias" for linear in self.biased)]
        for name in wanted:
            linear = name.rpartition(".")[0]
            is_weight = linear in self.shapes and name.endswith(".weight")
            parts = _parts(linear, self.config) if is_weight else _tensor_parts(name, self.config)
            missing = [part for part, _ in parts if part not in self.by_name]
            if missing:
                raise ModelLoadError(f"this GGUF has no tensor for {missing[0]}; is it a whole model?")
            used.update(part for part, _ in parts)
            for part, _ in parts if is_weight else []:
                type_name = self.by_name[part].tensor_type.name
                if not has_codes(type_name) and type_name not in PLAIN_TYPES:
                    skipped.setdefault(type_name, []).append(self.by_name[part].name)
        unexpected = sorted(set(self.by_name) - used)
        if unexpected:
            raise ModelLoadError(
                f"this GGUF holds tensors {self.config.architecture} does not take: {unexpected[:5]} "
                f"({len(unexpected)} in all)"
            )
        _warn_expanded(skipped)


def _parts(linear: str, config: ModelConfig) -> list[tuple[str, int | None]]:
    """A model linear's checkpoint tensors (a tied LM head's: the embedding), in row order."""
    if linear == "lm_head" and config.tie_word_embeddings:
        return [("model.embed_tokens.weight", None)]
    return checkpoint_parts(linear + ".weight", config) or [(linear + ".weight", None)]


def _tensor_parts(name: str, config: ModelConfig) -> list[tuple[str, int | None]]:
    """A module tensor's checkpoint tensors (a fused bias's parts, or itself)."""
    return checkpoint_parts(name, config) or [(name, None)]


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
        step = (
            rows if part in permuted else gguf_code_linears.CHUNK_ROWS
        )  # a permutation spans the whole tensor
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
