"""int8 linear layers for the CPU (the torch executor's ``quantization`` option): ``"int8"`` keeps the
weights as per-output-channel symmetric int8 codes and fp32 scales and the activations in the
model's dtype; ``"w8a8"`` also quantizes the activations, per token, and sums in int32.

``quantize_linears`` swaps a loaded model's ``nn.Linear``s for ``Int8Linear``s (the weights are
quantized from the checkpoint's values as loaded: the embedded GGUF's Q4 block codes are first
dequantized to the model's dtype, then requantized to int8 per output channel). The layers named in
``keep`` stay as they are (``pack_linears`` packs them afterwards): the mixed fallback for
sensitive layers (``W8A8_KEEP``: the LM head, whose weight-only int8 form it gets instead).
``Quantization`` does the same a group at a time as the model loads (``build_model``'s ``on_group``):
the executor's path, which never holds the whole model in its checkpoint dtype. A quantized layer's
tensors go to a prepared file as ``stored_tensors`` names them and come back with ``from_stored``.

With the compiled kernels an ``Int8Linear`` runs ``int8_linear`` / ``w8a8_linear`` for every input
(batch-invariant); without them torch's own int8 operators (``aten._weight_int8pack_mm``, and
``torch._int_mm`` on the activations quantized the same way: the same int32 sums).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hetero_core.model.cpu.kernel_int8 import group_sums, quantize_int8_rows, quantize_int8_weight
from hetero_core.model.cpu.linear import PackedLinear

QUANTIZATIONS = {
    "int8": "weight-only int8 (per output channel); activations in the model's dtype",
    "w8a8": "int8 weights (per output channel) and activations (per token, dynamic), int32 sums; "
    "the LM head weight-only int8",
}
W8A8_KEEP = ("lm_head",)  # layers W8A8 runs weight-only: the logits are the most sensitive output
# an Int8Linear's tensors by name suffix, as a prepared file stores them (``stored_tensors``)
STORED_CODES, STORED_SCALE, STORED_COLSUM, STORED_BIAS = (
    ".int8_codes",
    ".int8_scale",
    ".int8_colsum",
    ".int8_bias",
)
STORED_SUFFIXES = (STORED_CODES, STORED_SCALE, STORED_COLSUM, STORED_BIAS)


class Int8Linear(nn.Module):
    """``y = x @ (scale * codes).T + bias`` with int8 ``codes`` [out, in] and fp32 scales per output
    channel (``group_size`` 0) or per group of ``group_size`` inputs; ``activations = "int8"``: each row
    of ``x`` quantized to int8 first, per token and group of the same inputs (W8A8)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        kernels=None,
        activations: str = "float",
        group_size: int = 0,
    ):
        super().__init__()
        if activations not in ("float", "int8"):
            raise ValueError(f"activations must be 'float' or 'int8', got {activations!r}")
        with torch.no_grad():
            codes, scale = quantize_int8_weight(weight, group_size)
            self.out_features, self.in_features = codes.shape
            self.group_size = self.in_features // scale.shape[1]
            self.activations = activations
            colsum = group_sums(codes, scale.shape[1]) if activations == "int8" else None
            packed = kernels.pack_int8_linear(codes, scale, colsum) if kernels is not None else None
            self.kernels = kernels if packed is not None else None
            # the kernels' layouts, or, for torch's operators, codes [out, in] and scales [out, groups]
            self.codes, self.scale, self.colsum = (
                packed + (None,) * (3 - len(packed)) if packed else (codes, scale, colsum)
            )
            self.bias_f32 = None if bias is None else bias.detach().float().contiguous()
        self.float32_output = False  # True: fp32 results (the LM head's logits)

    @classmethod
    def from_stored(cls, stored: dict[str, torch.Tensor], kernels=None) -> Int8Linear:
        """The layer ``stored_tensors`` gave (a prepared file's views: nothing quantized or copied).
        Codes in the kernels' layout (4-d) need ``kernels``; W8A8 is the layer whose group sums were
        stored. ValueError for tensors that do not make a layer."""
        codes, scale = stored[STORED_CODES], stored[STORED_SCALE]
        colsum, bias = stored.get(STORED_COLSUM), stored.get(STORED_BIAS)
        packed = codes.dim() == 4
        if packed and kernels is None:
            raise ValueError("int8 codes in the compiled kernels' layout, but no kernels to run them")
        if codes.dtype != torch.int8 or codes.dim() not in (2, 4) or scale.dim() != codes.dim() - 1:
            raise ValueError(f"stored int8 layer of codes {tuple(codes.shape)}, scale {tuple(scale.shape)}")
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        if packed:
            self.out_features, self.in_features = codes.shape[0] * codes.shape[2], codes.shape[1] * 4
        else:
            self.out_features, self.in_features = codes.shape
        self.group_size = self.in_features // scale.shape[1]
        self.activations = "int8" if colsum is not None else "float"
        self.kernels = kernels if packed else None
        self.codes, self.scale, self.colsum, self.bias_f32 = codes, scale, colsum, bias
        self.float32_output = False
        return self

    def stored_tensors(self) -> dict[str, torch.Tensor]:
        """What ``from_stored`` rebuilds this layer from, by name suffix (a prepared file's entries)."""
        tensors = {STORED_CODES: self.codes, STORED_SCALE: self.scale}
        if self.colsum is not None:
            tensors[STORED_COLSUM] = self.colsum
        if self.bias_f32 is not None:
            tensors[STORED_BIAS] = self.bias_f32
        return tensors

    @property
    def weight_bytes(self) -> int:
        """Bytes of this layer's weight as it runs: the codes and the scales (and W8A8's group sums)."""
        return sum(
            t.numel() * t.element_size() for t in (self.codes, self.scale, self.colsum) if t is not None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.dtype not in (torch.float32, torch.bfloat16):
            rows = rows.float()
        out_dtype = torch.float32 if self.float32_output else rows.dtype
        if self.kernels is not None and self.activations == "int8":
            out = self.kernels.w8a8_linear(
                rows, self.codes, self.scale, self.colsum, self.bias_f32, out_dtype
            )
        elif self.kernels is not None:
            out = self.kernels.int8_linear(rows, self.codes, self.scale, self.bias_f32, out_dtype)
        else:
            out = self._torch_forward(rows).to(out_dtype)
        return out.reshape(*x.shape[:-1], self.out_features)

    def _torch_forward(self, rows: torch.Tensor) -> torch.Tensor:
        """torch's int8 operators (no compiled kernels): the same int32 sums for W8A8, other roundings."""
        groups = self.scale.shape[1]
        if self.activations == "int8":
            size = self.group_size
            codes, row_scale = quantize_int8_rows(rows, size)
            sums = [
                torch._int_mm(
                    codes[:, g * size : (g + 1) * size].contiguous(),
                    self.codes[:, g * size : (g + 1) * size].t(),
                )
                for g in range(groups)
            ]
            out = sum(s.float() * (row_scale[:, g, None] * self.scale[:, g]) for g, s in enumerate(sums))
        elif groups == 1:
            out = torch.ops.aten._weight_int8pack_mm(rows.float(), self.codes, self.scale[:, 0].contiguous())
        else:
            weight = self.codes.float().reshape(self.out_features, groups, -1) * self.scale[:, :, None]
            out = torch.nn.functional.linear(
                rows.float(), weight.reshape(self.out_features, self.in_features)
            )
        return out if self.bias_f32 is None else out + self.bias_f32

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"group_size={self.group_size}, "
            f"activations={self.activations}, bias={self.bias_f32 is not None}"
        )


def quantize_linears(
    model: nn.Module,
    quantization: str,
    kernels=None,
    keep: tuple[str, ...] | None = None,
    skip: tuple[str, ...] = (),
    group_size: int = 0,
) -> int:
    """Replace ``model``'s ``nn.Linear``s by ``Int8Linear``s for ``quantization`` (a key of
    ``QUANTIZATIONS``); those whose attribute name is in ``keep`` (default: W8A8's ``W8A8_KEEP``) run
    weight-only instead of W8A8, those in ``skip`` stay ``nn.Linear`` (in the model's dtype);
    ``group_size``: scales per group of that many inputs (0: per output channel).
    Returns how many were replaced."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; choices: {', '.join(QUANTIZATIONS)}")
    keep = (W8A8_KEEP if quantization == "w8a8" else ()) if keep is None else keep
    if hasattr(model, "untie_lm_head"):
        model.untie_lm_head()
    found = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear) and name not in skip
    ]
    for parent, name, child in found:
        activations = "int8" if quantization == "w8a8" and name not in keep else "float"
        setattr(parent, name, Int8Linear(child.weight, child.bias, kernels, activations, group_size))
    return len(found)


@dataclass(frozen=True)
class Quantization:
    """How a model's linears are quantized as it loads (the torch executor's ``quantization`` and
    ``quantization_group_size``); called as ``model_builder.build_model``'s ``on_group``, it quantizes
    each group's linears the moment they are in place, so the plain weights of one layer at most are
    ever held beside the int8 ones (the LM head last, untied from tied embeddings first)."""

    method: str
    group_size: int = 0
    kernels: object = None

    def __post_init__(self):
        if self.method not in QUANTIZATIONS:
            raise ValueError(f"unknown quantization {self.method!r}; choices: {', '.join(QUANTIZATIONS)}")

    @property
    def key(self) -> list:
        """What the quantized weights depend on (a prepared file's name and key)."""
        return [self.method, self.group_size]

    def __call__(self, model: nn.Module, prefix: str) -> None:
        if not prefix:  # the group outside the decoder layers (model_builder.REST): the LM head's
            if hasattr(model, "untie_lm_head"):
                model.untie_lm_head()
            module = model
        else:
            module = model.get_submodule(prefix)
        quantize_linears(module, self.method, self.kernels, group_size=self.group_size)


def linear_weight_bytes(model: nn.Module) -> int:
    """Bytes of the weights of ``model``'s linears as they run (packed, int8 or plain)."""
    total = 0
    for module in model.modules():
        if isinstance(module, Int8Linear):
            total += module.weight_bytes
        elif isinstance(module, PackedLinear):
            for name in ("kernel_weight", "packed_weight", "plain_weight"):
                tensor = getattr(module, name)
                if tensor is not None:
                    total += (
                        tensor.numel() * tensor.element_size()
                        if tensor.layout == torch.strided
                        else module.in_features * module.out_features * 2
                    )
        elif isinstance(module, nn.Linear):
            total += module.weight.numel() * module.weight.element_size()
    return total
