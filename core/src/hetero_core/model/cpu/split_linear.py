"""A fused linear whose row ranges are packed in different block-code formats (a GGUF's mixed q/k/v).

The fused q/k/v and gate/up projections (``fusion``) are one linear: their parts' rows concatenated.
A GGUF may store the parts in types whose codes share no layout: Q4_K_M keeps q and k as Q4_K
(blocks of 32 inputs, ``d * q + m``) and v, in some layers, as Q6_K (blocks of 16, ``d * q``, a
scale per 16 inputs). Neither converts to the other exactly: a Q4_K block's ``m`` has no place in
the 16-input format, and a Q6_K block's two scales per 32 inputs are not one scale times an int8
code. So those parts stay apart, each a ``PackedLinear`` over its own codes (parts of one layout are
merged first, ``gguf_codes_loader``), and ``SplitLinear`` runs them in turn and concatenates their
outputs: the same values as the one fused weight, code for code. A split gate/up returns gate and up
(no SwiGLU inside), and the MLP applies the activation (the kernels' SiLU-and-multiply: the fused
SwiGLU's bits). The fused decode step (``fused_decode``) runs the same parts in the same order, each
into its columns of the step's buffer.

In the prepared file each part is stored as ``<name>.kernel_parts.<i>`` (``prepared_file``).
"""

from __future__ import annotations

import torch
from torch import nn

from hetero_core.model.cpu.linear import PackedLinear

PARTS_SUFFIX = ".kernel_parts."  # a split linear's part i in the prepared file: <name>.kernel_parts.<i>


class SplitLinear(nn.Module):
    """``y = concat(part(x) for part in parts)``: row ranges of one linear, each in its kernel layout."""

    def __init__(self, parts: list[PackedLinear]):
        super().__init__()
        if not parts or any(p.swiglu or not p.all_rows for p in parts):
            raise ValueError("a split linear takes block-code parts in the kernels' layout, none with SwiGLU")
        if len({p.in_features for p in parts}) > 1:
            raise ValueError(f"the parts disagree on their inputs: {[p.in_features for p in parts]}")
        self.parts = nn.ModuleList(parts)
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self.all_rows, self.swiglu, self.kernel_dtype = True, False, "codes"

    @classmethod
    def from_kernel_layouts(
        cls, packed: list[torch.Tensor], biases: list[torch.Tensor | None], kernels
    ) -> SplitLinear:
        """The split linear of parts ``packed`` (each in the kernels' block-code layout) and their biases."""
        parts = [PackedLinear.from_kernel_layout(w, b, kernels) for w, b in zip(packed, biases, strict=True)]
        return cls(parts)

    @property
    def float32_output(self) -> bool:
        return self.parts[0].float32_output

    @float32_output.setter
    def float32_output(self, value: bool) -> None:
        for part in self.parts:
            part.float32_output = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, parts={len(self.parts)}"
