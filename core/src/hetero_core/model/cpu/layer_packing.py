"""Packing as loading streams: each decoder layer's linears (and MoE experts) packed for the CPU the
moment that layer's weights are in place, and, given a prepared file, written to it at once.

``LayerPacking`` is ``model_builder.build_model``'s ``on_group`` callback. A layer's plain weights
are dropped as soon as it is packed (and written), so loading never holds the whole model in two
layouts (plain and packed), and never in memory the way the prepared file holds it: only the layer
in hand is in both. The LM head comes last (``REST``), untied from tied embeddings first, as
``prepared_weights.pack_model`` does it for a model loaded whole.

What is written for a packed model, as ``prepared_file`` loads it back: every tensor of its state
dict (norms, embeddings, biases), each linear in the kernels' layout (``<name>.kernel_weight``; a
``SplitLinear``'s parts as ``<name>.kernel_parts.<i>``), or, for a linear oneDNN packs (opaque,
reordered again at load), its plain fused weight. A group may arrive with linears already packed (a
GGUF's codes, ``gguf_codes_loader``): they are written as they are. Only the
built-in ``LlamaForCausalLM`` is written (``prepared_file._assemble`` rebuilds that class).

With ``quantization`` (int8 or W8A8, ``int8_linear.Quantization``) each group's linears are quantized
first, as that group arrives: peak memory is the int8 model plus one layer's plain weights, never the
whole model in its checkpoint dtype. Their codes, scales (and W8A8's group sums) are written as
``Int8Linear.stored_tensors`` names them, and the file's metadata records the quantization.
"""

from __future__ import annotations

import dataclasses
import json

import torch
from torch import nn

from hetero_core.logging import get_logger
from hetero_core.model.config import ModelConfig
from hetero_core.model.cpu.int8_linear import STORED_CODES, STORED_SUFFIXES, Int8Linear, Quantization
from hetero_core.model.cpu.linear import PackedLinear, pack_linears
from hetero_core.model.cpu.packed_experts import pack_experts
from hetero_core.model.cpu.prepared_file import FORMAT_VERSION, KERNEL_LAYOUT_SUFFIX
from hetero_core.model.cpu.prepared_writer import PreparedFileWriter, header_room
from hetero_core.model.cpu.split_linear import PARTS_SUFFIX, SplitLinear
from hetero_core.model.llama import LlamaForCausalLM
from hetero_core.model.model_builder import REST

log = get_logger("hetero.executor")

MAX_PARTS = 3  # a SplitLinear's parts at most (q, k, v), for the header's room


class NotWritten(Exception):
    """The prepared file was not written whole; ``reason`` says why (the model itself is fine)."""


def is_saved(model: nn.Module) -> bool:
    """Whether ``model``'s packed weights can go into a prepared file (the built-in Llama class only)."""
    return type(model) is LlamaForCausalLM and type(model.config) is ModelConfig


class LayerPacking:
    """``on_group(model, prefix)``: quantize the group's linears first where ``quantization`` is given
    (``int8_linear.Quantization``), pack the others for ``kernels`` and, given ``file`` (open for
    writing), write them to it; ``finish(model)`` completes the file (NotWritten when it was not)."""

    def __init__(self, kernels=None, file=None, quantization: Quantization | None = None):
        self.kernels, self.file, self.quantization = kernels, file, quantization
        self.writer: PreparedFileWriter | None = None
        self.written: set[str] = set()
        self.failure: str | None = None if file is not None else "no file to write"

    def __call__(self, model: nn.Module, prefix: str) -> None:
        if prefix == REST:
            model.untie_lm_head()
        module = model if prefix == REST else model.get_submodule(prefix)
        writing = self._writing(model)  # (before quantizing: the header's room counts the linears)
        if self.quantization is not None:
            self.quantization(model, prefix)
        plain = {}  # the plain weights of the linears oneDNN may take (stored as they are)
        if writing:
            plain = {
                f"{name}.weight": child.weight
                for name, child in module.named_modules(prefix=prefix)
                if isinstance(child, nn.Linear)
            }
        if prefix != REST:  # the experts are in the layers (packed there; their routers once)
            pack_experts(module, self.kernels)
        pack_linears(module, self.kernels)
        if writing and self.failure is None:
            self._write(model, module, prefix, plain)

    def finish(self, model: nn.Module) -> None:
        """Write the header (after every group); NotWritten when the file is not whole."""
        if self.failure is None and self.writer is None:
            self.failure = "the model had no weights to write"
        if self.failure is not None:
            raise NotWritten(self.failure)
        try:
            self.writer.finish(self._metadata(model))
        except (OSError, ValueError) as exc:
            raise NotWritten(str(exc)) from None

    def _writing(self, model: nn.Module) -> bool:
        """Whether this group goes to the file; the writer made at the first group (the header's room
        is sized from the model's names)."""
        if self.failure is not None:
            return False
        if self.writer is None:
            if not is_saved(model):
                self.failure = f"a {type(model).__name__} is packed at every load (no prepared file)"
                return False
            names = [*model.state_dict(keep_vars=True), "lm_head.weight"]
            linears = [
                name
                for name, child in model.named_modules()
                if isinstance(child, (nn.Linear, SplitLinear))
                or name == "lm_head"
                or (isinstance(child, PackedLinear) and ".parts." not in name)
            ]
            names += [name + KERNEL_LAYOUT_SUFFIX for name in linears]
            names += [f"{name}{PARTS_SUFFIX}{i}" for name in linears for i in range(MAX_PARTS)]
            if self.quantization:
                names += [name + suffix for name in linears for suffix in STORED_SUFFIXES]
            self.writer = PreparedFileWriter(self.file, header_room(names, self._metadata(model)))
        return True

    def _write(
        self, model: nn.Module, module: nn.Module, prefix: str, plain: dict[str, torch.Tensor]
    ) -> None:
        tensors = {
            name: tensor
            for name, tensor in module.state_dict(prefix=f"{prefix}." if prefix else "").items()
            if name not in self.written
        }
        for name, child in module.named_modules(prefix=prefix):
            if isinstance(child, Int8Linear) and name + STORED_CODES not in self.written:
                tensors.update({name + k: v for k, v in child.stored_tensors().items()})
            if isinstance(child, SplitLinear):  # (its parts are PackedLinears: skipped below)
                for index, part in enumerate(child.parts):
                    tensors[f"{name}{PARTS_SUFFIX}{index}"] = part.kernel_weight
                continue
            if not isinstance(child, PackedLinear) or ".parts." in name:
                continue
            if child.all_rows:
                tensors[name + KERNEL_LAYOUT_SUFFIX] = child.kernel_weight
            elif name + ".weight" in plain and not (name == "lm_head" and model.config.tie_word_embeddings):
                tensors[name + ".weight"] = plain[name + ".weight"]  # tied: the embedding itself
        tensors = {name: tensor for name, tensor in tensors.items() if name not in self.written}
        try:
            for name, tensor in tensors.items():
                self.writer.add(name, tensor)
                self.written.add(name)
        except (OSError, ValueError) as exc:  # a full disk: the model loads on, without the file
            self.failure = f"writing {name}: {exc}"

    def _metadata(self, model: nn.Module) -> dict[str, str]:
        metadata = {"config": json.dumps(dataclasses.asdict(model.config)), "format": str(FORMAT_VERSION)}
        if self.quantization is not None:
            metadata["quantization"] = json.dumps(self.quantization.key)
        return metadata
