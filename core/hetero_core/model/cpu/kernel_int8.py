"""The compiled kernels' int8 linears (``csrc/int8_linear.c``), as methods of ``kernels.CpuKernels``:
per-output-channel symmetric int8 weights, then ``x @ W.T + bias`` with the activations as they are
(``int8_linear``, weight-only) or quantized per token to int8 (``w8a8_linear``, int32 sums through
AVX-512 VNNI where the CPU has it, plain int32 vector arithmetic elsewhere: the same sums, exactly).

Shapes by contract: any number of rows (none too), outputs in whole 16-column panels, inputs a
multiple of 4 and at most 65,536 (the int32 sums cannot overflow). A weight that does not fit is not
packed (``pack_int8_linear`` returns None); an input that does not fit is a ValueError.
"""

from __future__ import annotations

import ctypes

import torch

from hetero_core.model.cpu.kernel_linears import PANEL, check_status, pointer, last_dim_contiguous

MAX_IN_FEATURES = 65536
INT8_MAX = 127


def quantize_int8_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` [N, K] -> (codes int8 [N, K], scale fp32 [N]): per output channel, symmetric,
    ``scale = max|w| / 127``, codes rounded to nearest (ties to even) in [-127, 127]; W ~ scale * codes.
    An all-zero row gets scale 0 and zero codes."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / INT8_MAX
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.round(w / safe[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return codes, scale.contiguous()


def quantize_int8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations [M, K] -> (codes int8 [M, K], scale fp32 [M]) per row (token), as ``w8a8_linear``
    quantizes them: ``q = round(x * (127 / max|x|))`` (ties to even) in [-127, 127], ``sx = max|x| / 127``."""
    x = x.float()
    absmax = x.abs().amax(dim=1)
    # 127 / max|x| as one fp32 division (a scalar over a tensor, torch multiplies by a reciprocal)
    inverse = torch.full_like(absmax, INT8_MAX).div(torch.where(absmax > 0, absmax, torch.ones_like(absmax)))
    inverse = torch.where(absmax > 0, inverse, torch.zeros_like(absmax))
    codes = torch.round(x * inverse[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return codes, absmax / INT8_MAX


class Int8Kernels:
    """Mixed into ``CpuKernels`` (which holds ``library``)."""

    library: ctypes.CDLL

    @property
    def w8a8_vnni(self) -> bool:
        """True where ``w8a8_linear`` sums with AVX-512 VNNI (elsewhere int32 vector arithmetic: the
        same sums, bit for bit)."""
        return bool(self.library.w8a8_linear_vnni())

    def pack_int8_linear(self, codes: torch.Tensor) -> torch.Tensor | None:
        """``codes`` int8 [N, K] -> the layout both int8 kernels read ([N / 16][K / 4][16][4]), or None
        where it does not apply (N not a multiple of 16, K not a multiple of 4 or above 65,536)."""
        out_features, in_features = codes.shape
        if (codes.dtype != torch.int8 or out_features % PANEL or in_features % 4
                or in_features > MAX_IN_FEATURES):
            return None
        return codes.reshape(out_features // PANEL, PANEL, in_features // 4, 4).permute(0, 2, 1, 3).contiguous()

    def int8_linear(self, x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                    out_dtype: torch.dtype) -> torch.Tensor:
        """``x @ (scale * codes).T + bias`` for ``x`` [M, K] fp32 or bf16, ``packed`` from
        ``pack_int8_linear``, ``scale`` and ``bias`` fp32 [N] -> [M, N] in ``out_dtype`` (fp32 or bf16)."""
        return self._run("int8_linear", x, packed, scale, None, bias, out_dtype)

    def w8a8_linear(self, x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, colsum: torch.Tensor,
                    bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
        """As ``int8_linear`` with each row of ``x`` quantized to int8 first (``quantize_int8_rows``) and
        the products summed exactly in int32; ``colsum`` int32 [N]: the codes' sum over K per output."""
        if colsum.dtype != torch.int32 or colsum.shape != scale.shape or not colsum.is_contiguous():
            raise ValueError(f"w8a8_linear: colsum must be a contiguous int32 {tuple(scale.shape)}")
        return self._run("w8a8_linear", x, packed, scale, colsum, bias, out_dtype)

    def _run(self, kernel: str, x, packed, scale, colsum, bias, out_dtype) -> torch.Tensor:
        out_features, in_features = packed.shape[0] * PANEL, packed.shape[1] * 4
        if (x.dim() != 2 or x.dtype not in (torch.float32, torch.bfloat16) or x.device.type != "cpu"
                or x.shape[1] != in_features):
            raise ValueError(f"{kernel}: x must be a CPU float32 or bfloat16 tensor [rows, {in_features}], "
                             f"got {str(x.dtype).removeprefix('torch.')} {tuple(x.shape)} on {x.device}")
        if out_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"{kernel}: out_dtype must be float32 or bfloat16, got {out_dtype}")
        for name, vector in (("scale", scale), ("bias", bias)):
            if vector is not None and (vector.dtype != torch.float32 or vector.shape != (out_features,)
                                       or not vector.is_contiguous()):
                raise ValueError(f"{kernel}: {name} must be a contiguous float32 [{out_features}]")
        x = last_dim_contiguous(x)
        if x.shape[0] > 1 and x.stride(0) < in_features:
            x = x.contiguous()
        ldx = x.stride(0) if x.shape[0] > 1 else in_features
        out = torch.empty((x.shape[0], out_features), dtype=out_dtype)
        args = [x.data_ptr(), ldx, int(x.dtype == torch.bfloat16), packed.data_ptr(), scale.data_ptr()]
        if colsum is not None:
            args.append(colsum.data_ptr())
        args += [pointer(bias), out.data_ptr(), out_features, x.shape[0], out_features, in_features,
                 int(out_dtype == torch.bfloat16), torch.get_num_threads()]
        status = getattr(self.library, kernel)(*args)
        check_status(status, kernel.replace("_", " "), f"{x.shape[0]} rows, {out_features} outputs, {in_features} inputs")
        return out
