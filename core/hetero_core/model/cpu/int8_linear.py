"""int8 linear layers for the CPU (the torch executor's ``quantization`` option): ``"int8"`` keeps the
weights as per-output-channel symmetric int8 codes and fp32 scales and the activations in the
model's dtype; ``"w8a8"`` also quantizes the activations, per token, and sums in int32.

``quantize_linears`` swaps a loaded model's ``nn.Linear``s for ``Int8Linear``s (the weights are
quantized from the checkpoint's values as loaded: the embedded GGUF's Q4 block codes are first
dequantized to the model's dtype, then requantized to int8 per output channel). The layers named in
``keep`` stay as they are (``pack_linears`` packs them afterwards): the mixed fallback for
sensitive layers (``W8A8_KEEP``: the LM head, whose weight-only int8 form it gets instead).

With the compiled kernels an ``Int8Linear`` runs ``int8_linear`` / ``w8a8_linear`` for every input
(batch-invariant); without them torch's own int8 operators (``aten._weight_int8pack_mm``, and
``torch._int_mm`` on the activations quantized the same way: the same int32 sums).
"""

from __future__ import annotations

import torch
from torch import nn

from hetero_core.model.cpu.kernel_int8 import quantize_int8_rows, quantize_int8_weight
from hetero_core.model.cpu.linear import PackedLinear

QUANTIZATIONS = {
    "int8": "weight-only int8 (per output channel); activations in the model's dtype",
    "w8a8": "int8 weights (per output channel) and activations (per token, dynamic), int32 sums; "
            "the LM head weight-only int8",
}
W8A8_KEEP = ("lm_head",)  # layers W8A8 runs weight-only: the logits are the most sensitive output


class Int8Linear(nn.Module):
    """``y = x @ (scale * codes).T + bias`` with int8 ``codes`` [out, in] and fp32 ``scale`` [out];
    ``activations = "int8"``: each row of ``x`` quantized to int8 first (W8A8)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kernels=None, activations: str = "float"):
        super().__init__()
        if activations not in ("float", "int8"):
            raise ValueError(f"activations must be 'float' or 'int8', got {activations!r}")
        with torch.no_grad():
            codes, self.scale = quantize_int8_weight(weight)
            self.out_features, self.in_features = codes.shape
            self.activations = activations
            self.packed = kernels.pack_int8_linear(codes) if kernels is not None else None
            self.kernels = kernels if self.packed is not None else None
            self.codes = codes if self.packed is None else None  # torch's operators read [out, in]
            self.colsum = codes.sum(dim=1, dtype=torch.int32) if activations == "int8" else None
            self.bias_f32 = None if bias is None else bias.detach().float().contiguous()
        self.float32_output = False  # True: fp32 results (the LM head's logits)

    @property
    def weight_bytes(self) -> int:
        """Bytes of this layer's weight as it runs: the codes and the scales (and column sums)."""
        tensors = (self.packed if self.packed is not None else self.codes, self.scale, self.colsum)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.dtype not in (torch.float32, torch.bfloat16):
            rows = rows.float()
        out_dtype = torch.float32 if self.float32_output else rows.dtype
        if self.kernels is not None and self.activations == "int8":
            out = self.kernels.w8a8_linear(rows, self.packed, self.scale, self.colsum, self.bias_f32, out_dtype)
        elif self.kernels is not None:
            out = self.kernels.int8_linear(rows, self.packed, self.scale, self.bias_f32, out_dtype)
        else:
            out = self._torch_forward(rows).to(out_dtype)
        return out.reshape(*x.shape[:-1], self.out_features)

    def _torch_forward(self, rows: torch.Tensor) -> torch.Tensor:
        if self.activations == "int8":
            codes, row_scale = quantize_int8_rows(rows)
            sums = torch._int_mm(codes, self.codes.t())  # int32, exact
            out = sums.float() * (row_scale[:, None] * self.scale)
        else:
            out = torch.ops.aten._weight_int8pack_mm(rows.float(), self.codes, self.scale)
        return out if self.bias_f32 is None else out + self.bias_f32

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"activations={self.activations}, bias={self.bias_f32 is not None}")


def quantize_linears(model: nn.Module, quantization: str, kernels=None, keep: tuple[str, ...] | None = None) -> int:
    """Replace ``model``'s ``nn.Linear``s by ``Int8Linear``s for ``quantization`` (a key of
    ``QUANTIZATIONS``); those whose attribute name is in ``keep`` (default: W8A8's ``W8A8_KEEP``) run
    weight-only instead of W8A8. Returns how many were replaced."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; choices: {', '.join(QUANTIZATIONS)}")
    keep = (W8A8_KEEP if quantization == "w8a8" else ()) if keep is None else keep
    if hasattr(model, "untie_lm_head"):
        model.untie_lm_head()
    found = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if isinstance(child, nn.Linear)]
    for parent, name, child in found:
        activations = "int8" if quantization == "w8a8" and name not in keep else "float"
        setattr(parent, name, Int8Linear(child.weight, child.bias, kernels, activations))
    return len(found)


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
                    total += tensor.numel() * tensor.element_size() if tensor.layout == torch.strided else \
                        module.in_features * module.out_features * 2
        elif isinstance(module, nn.Linear):
            total += module.weight.numel() * module.weight.element_size()
    return total
