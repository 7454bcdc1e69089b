"""oneDNN-packed linear layers for CPU inference (fp32, and bf16 where oneDNN computes it).

``F.linear`` on CPU calls MKL's sgemm, which runs far below the machine's peak on the 2-core AMD
EPYC (AVX-512) we measure on: ~175 GFLOP/s for prefill-sized matmuls, ~15 GB/s of weight streaming
at batch 1. oneDNN, which ships inside torch and picks its kernels by ISA, runs the same fp32 math
there at ~430 GFLOP/s and ~37 GB/s (the memory bus), once each weight is reordered into its blocked
layout. ``pack_linears`` does that reordering after loading; the model code does not change, only
the modules its linears are. The torch executor's ``prepack_weights = false`` turns this off.

In bf16 (on a CPU with AVX-512 BF16 or AMX) the packed weights beat torch's own bf16 linear by
1.3-1.9x at decode batch sizes (1-32 rows; measured on a 2-core AMD EPYC with avx512_bf16) and
match it on prefill-sized batches, where both reach ~850 GFLOP/s.

The packed weight is an opaque oneDNN tensor kept as a plain attribute (not a parameter or buffer):
a packed model is for inference only and its ``state_dict`` holds no linear weights.

With the compiled CPU kernels, a linear keeps its weight in the layout of the kernels' own linear
instead and runs there (``kernel_weight``) for every input, whatever its rows: ``bf16_linear`` in bf16
(AVX-512 BF16 dot products, or the weight widened to fp32 where the CPU has none), ``f32_linear`` in
fp32 on any CPU. At 1-32 rows (decode steps) they are 1.1-1.6x (bf16) and 1.1-2x (fp32) faster than
oneDNN, because each thread streams the weight from memory while the dot products run, and they
match it at prefill sizes (fp32, 2-core AMD EPYC Zen 5: 500-520 GFLOP/s with AVX-512, 260-267 with
AVX2, oneDNN 490-510 and 233-266; wider layers than SmolLM2's lose up to ~20 % to oneDNN there: fp32
at 8,192 inputs and 1,024 rows, 406 GFLOP/s against 496). One kernel at every batch size is what
makes a row's result independent of its batch-mates (batch invariance): oneDNN picks its algorithm,
and its order of summation, by the number of rows. In fp32, a weight whose values are
exact block codes (a Q4_1 or Q8_0 GGUF's, ``block_codes``) keeps the codes instead (``"codes"``):
0.625-1.25 bytes per weight instead of 4. By default (``code_activations = "float"``)
``coded_linear`` expands the codes to fp32, the same results as the fp32 weights bit for bit; with
"int8" (opt-in, where the CPU has AVX-512 VNNI or AVX2) the activations are quantized to int8 per
block and multiplied with the codes in integers (``q8a_coded_linear``: batch-invariant, within the
activations' rounding of fp32: perplexity within 1% of float's, but greedy answers can differ from
the fp32 model's, so it is not the default) (decode steps 1.1-2.8x faster where the weight stream
bounds them; calls of 16 rows or more on AMX-INT8 tiles where the CPU has them, ``amx_int8``, the
same bits). The LM head
(``float32_output``) returns fp32 logits; in bf16 they are the fp32 sums as they are: logits no longer
rounded to bf16's 8 bits (0.125 apart near 25), which had turned near-ties into exact ties. The MLPs'
fused gate/up projections return ``silu(gate) * up`` straight from the kernel's registers
(``swiglu``): no gate/up output written and read back, no separate ``silu_mul`` pass (1.0-1.2x that
pair at SmolLM2's MLP shape). A weight no kernel layout takes (outputs not a multiple of 16; bf16 with an
odd number of inputs) stays with oneDNN.
"""

from __future__ import annotations

import torch
from torch import nn

from hetero_core.model.cpu.code_panels import code_in_features


def can_pack(device: torch.device, dtype: torch.dtype, kernels=None) -> bool:
    """True when linears can be packed here: for ``kernels``' own linear (fp32, bf16), or for oneDNN
    (fp32, or bf16 where oneDNN supports it, on a CPU torch built with oneDNN)."""
    if device.type != "cpu":
        return False
    return kernel_layout(kernels, dtype) is not None or _onednn_runs(dtype)


def _onednn_runs(dtype: torch.dtype) -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return dtype == torch.float32


def kernel_layout(kernels, dtype: torch.dtype) -> str | None:
    """Which linear of ``kernels`` runs ``dtype`` here: ``"bf16"``, ``"f32"``, or None (oneDNN); a
    weight already packed as block codes (uint8 or int8, ``block_codes``) runs in ``"codes"``."""
    if kernels is None:
        return None
    if dtype in (torch.uint8, torch.int8):
        return "codes"
    if dtype == torch.float32:
        return "f32"
    return "bf16" if dtype == torch.bfloat16 else None


class PackedLinear(nn.Module):
    """``y = x @ weight.T + bias`` with ``weight`` in oneDNN's blocked layout, or, given ``kernels``
    whose linear takes it, in the layout of that linear for its dtype (then for every input).

    ``swiglu``: the MLP's fused gate/up projection (gate rows first). Where the kernels' linear takes
    it (``self.swiglu`` stays True) ``forward`` returns ``silu(gate) * up`` ([..., out_features / 2]),
    computed in registers: the gate/up output is never stored. Elsewhere it is a plain linear and the
    MLP applies the activation."""

    def __init__(
        self,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        kernels=None,
        *,
        kernel_weight: torch.Tensor | None = None,
        swiglu: bool = False,
    ):
        """``weight`` [out, in] to pack; or ``kernel_weight`` already in the kernels' layout (then
        ``weight`` is None; ``from_kernel_layout``)."""
        super().__init__()
        with torch.no_grad():
            dtype = weight.dtype if weight is not None else kernel_weight.dtype
            self.kernel_dtype = kernel_layout(kernels, dtype)
            fused = swiglu and self.kernel_dtype is not None and kernels.fuses_swiglu(dtype)
            if kernel_weight is not None and swiglu and not fused:
                raise ValueError("a gate/up weight packed for the SwiGLU linear needs kernels that fuse it")
            swiglu = fused
            if kernel_weight is None and self.kernel_dtype == "f32":  # exact block codes: 3-5x fewer bytes
                kernel_weight = kernels.pack_coded_linear(weight, swiglu=swiglu)
                if kernel_weight is not None:
                    self.kernel_dtype = "codes"
            if kernel_weight is None and self.kernel_dtype is not None:
                pack = kernels.pack_bf16_linear if self.kernel_dtype == "bf16" else kernels.pack_f32_linear
                kernel_weight = pack(weight, swiglu=swiglu)
            self.kernel_weight = kernel_weight
            self.swiglu = swiglu and kernel_weight is not None
            if kernel_weight is None:
                self.kernel_dtype = None
                self.out_features, self.in_features = weight.shape
            elif self.kernel_dtype == "bf16":  # [N / 16][K / 2][16][2]
                self.out_features, self.in_features = kernel_weight.shape[0] * 16, kernel_weight.shape[1] * 2
            elif self.kernel_dtype == "codes":  # [N / 16][K / 32 or K / 16][bytes]
                self.out_features, self.in_features = (
                    kernel_weight.shape[0] * 16,
                    code_in_features(kernel_weight),
                )
            else:  # [N / 16][K][16]
                self.out_features, self.in_features = kernel_weight.shape[0] * 16, kernel_weight.shape[1]
            self.all_rows = (
                kernel_weight is not None
            )  # the kernel's layout serves every input (no oneDNN copy)
            self.packed_weight = self.plain_weight = (
                None  # the weight for oneDNN, or, where it cannot, for torch
            )
            if not self.all_rows and _onednn_runs(dtype):
                self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(
                    weight.detach().contiguous(), None
                )
            elif not self.all_rows:
                self.plain_weight = weight.detach()
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.kernels = kernels if self.kernel_weight is not None else None
        self.float32_output = False  # True: fp32 results (the LM head's logits), bf16's sums unrounded
        self.bias_f32 = None
        if bias is not None and self.kernels is not None:  # in the packed weight's column order
            order_dtype = torch.bfloat16 if self.kernel_dtype == "bf16" else torch.float32
            self.bias_f32 = (
                (kernels.swiglu_order(bias, order_dtype) if self.swiglu else bias)
                .detach()
                .float()
                .contiguous()
            )

    @property
    def int8_activations(self) -> bool:
        """True where this block-code linear runs with int8 activations (``q8a_coded_linear``: the
        kernels' ``int8_code_activations``, inputs in whole blocks of 32)."""
        return (
            self.kernel_dtype == "codes"
            and self.kernels is not None
            and self.kernels.int8_code_activations
            and self.in_features % 32 == 0
        )

    @classmethod
    def from_kernel_layout(
        cls, kernel_weight: torch.Tensor, bias: torch.Tensor | None, kernels, swiglu: bool = False
    ) -> PackedLinear:
        """A linear whose weight is already in the layout of the kernels' linear for its dtype (a
        prepared file's; packed with ``swiglu`` as given), used as it is."""
        if kernel_layout(kernels, kernel_weight.dtype) is None:
            raise ValueError(f"no kernel linear runs {kernel_weight.dtype} here")
        return cls(None, bias, kernels, kernel_weight=kernel_weight, swiglu=swiglu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernels = self.kernels
        if self.kernel_weight is not None:  # (use_cpu_kernels hands ``kernels`` to oneDNN's linears too)
            rows = x.reshape(-1, self.in_features)
            if self.kernel_dtype == "f32":
                out = kernels.f32_linear(rows, self.kernel_weight, self.bias_f32, swiglu=self.swiglu)
            elif self.kernel_dtype == "codes":  # fp32 out of fp32 rows (and for the LM head), else x's dtype
                out_dtype = torch.float32 if self.float32_output else rows.dtype
                if self.int8_activations:
                    out = kernels.q8a_coded_linear(
                        rows, self.kernel_weight, self.bias_f32, swiglu=self.swiglu, out_dtype=out_dtype
                    )
                else:
                    out = kernels.coded_linear(
                        rows.float(), self.kernel_weight, self.bias_f32, swiglu=self.swiglu
                    ).to(out_dtype)
            else:
                out_dtype = torch.float32 if self.float32_output else torch.bfloat16
                out = kernels.bf16_linear(
                    rows.to(torch.bfloat16), self.kernel_weight, self.bias_f32, out_dtype, swiglu=self.swiglu
                )
            return out.reshape(*x.shape[:-1], out.shape[-1])
        if self.packed_weight is not None:
            out = torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")
        else:
            out = torch.nn.functional.linear(x, self.plain_weight, self.bias)
        return out.float() if self.float32_output else out

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={bias}"


def pack_linears(model: nn.Module, kernels=None) -> int:
    """Replace every ``nn.Linear`` inside ``model`` by a ``PackedLinear`` (given the compiled CPU
    ``kernels``, with their linear where it applies, the MLPs' gate/up projections with their SwiGLU
    activation inside); return how many."""
    places = [
        (parent, name)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]
    for parent, name in places:  # no list of the old linears: each plain weight goes once it is packed
        child = getattr(parent, name)
        packed = PackedLinear(child.weight, child.bias, kernels, swiglu=is_swiglu_projection(parent, name))
        del child
        setattr(parent, name, packed)
    return len(places)


def is_swiglu_projection(parent: nn.Module, name: str) -> bool:
    """True for the fused gate/up projection of a SwiGLU MLP, which packs with its activation."""
    from hetero_core.model.layers import SwiGLU

    return isinstance(parent, SwiGLU) and name == "gate_up_proj"
