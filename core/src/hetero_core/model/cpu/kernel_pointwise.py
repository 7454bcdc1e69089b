"""The compiled kernels' element-wise steps (``csrc/pointwise.c``), as methods of ``kernels.CpuKernels``:
residual add + RMSNorm, SiLU-and-multiply and RoPE in place, one pass each instead of 5-7 eager
torch ops. Rows may be strided; every row is one fixed-order computation (batch invariance).
"""

from __future__ import annotations

import ctypes

import torch

from hetero_core.model.cpu.kernel_linears import DTYPE_SUFFIXES, check_status, last_dim_contiguous


class PointwiseKernels:
    """Mixed into ``CpuKernels`` (which holds ``library``)."""

    library: ctypes.CDLL

    def handles(self, tensor: torch.Tensor, width: int) -> bool:
        """True for a CPU tensor of a dtype the element-wise kernels compute (rows of any width)."""
        return tensor.device.type == "cpu" and tensor.dtype in DTYPE_SUFFIXES and width > 0

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``weight * x / rms(x)`` over the last dimension of ``x`` [rows, hidden] (rows may be
        strided); with ``residual`` (same shape, updated in place) of ``residual + x`` instead."""
        rows, hidden = x.shape
        if (
            x.dtype not in DTYPE_SUFFIXES
            or weight.shape != (hidden,)
            or weight.dtype != x.dtype
            or not weight.is_contiguous()
        ):
            raise ValueError(
                f"rms_norm: x {str(x.dtype).removeprefix('torch.')} {tuple(x.shape)} needs a contiguous "
                f"weight [{hidden}] of its dtype, got {tuple(weight.shape)}"
            )
        x = last_dim_contiguous(x)
        out = torch.empty((rows, hidden), dtype=x.dtype)
        residual_ptr, residual_stride = None, 0
        if residual is not None:
            if residual.shape != x.shape or residual.dtype != x.dtype or residual.stride(-1) != 1:
                raise ValueError(f"rms_norm: residual {tuple(residual.shape)} must match x {tuple(x.shape)}")
            residual_ptr, residual_stride = residual.data_ptr(), residual.stride(0)
        status = getattr(self.library, "rms_norm_" + DTYPE_SUFFIXES[x.dtype])(
            x.data_ptr(),
            x.stride(0),
            residual_ptr,
            residual_stride,
            weight.data_ptr(),
            out.data_ptr(),
            hidden,
            rows,
            hidden,
            eps,
            torch.get_num_threads(),
        )
        check_status(status, "rms_norm", f"{rows} rows of {hidden}")
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` for ``gate_up`` [rows, 2 * width] (gate first) -> [rows, width]."""
        rows, width = gate_up.shape[0], gate_up.shape[1] // 2
        if gate_up.dtype not in DTYPE_SUFFIXES or gate_up.shape[1] % 2:
            raise ValueError(
                f"silu_mul: gate_up must be fp32 or bf16 [rows, 2 * width], got {tuple(gate_up.shape)}"
            )
        gate_up = last_dim_contiguous(gate_up)
        out = torch.empty((rows, width), dtype=gate_up.dtype)
        status = getattr(self.library, "silu_mul_" + DTYPE_SUFFIXES[gate_up.dtype])(
            gate_up.data_ptr(),
            gate_up.stride(0),
            out.data_ptr(),
            width,
            rows,
            width,
            torch.get_num_threads(),
        )
        check_status(status, "silu_mul", f"{rows} rows of {width}")
        return out

    def rotary_(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Rotate-half RoPE in place: ``x`` [tokens, heads, head_dim] (tokens may be strided, heads
        and dims contiguous), ``cos``/``sin`` [tokens, 1, head_dim // 2] contiguous, x's dtype."""
        tokens, heads, head_dim = x.shape
        if x.stride(2) != 1 or x.stride(1) != head_dim or not (cos.is_contiguous() and sin.is_contiguous()):
            raise ValueError("rotary_: x needs contiguous heads and cos/sin contiguous rows")
        if (
            cos.shape != (tokens, 1, head_dim // 2)
            or sin.shape != cos.shape
            or cos.dtype != x.dtype
            or head_dim % 2
        ):
            raise ValueError(
                f"rotary_: x {tuple(x.shape)} needs cos and sin [{tokens}, 1, {head_dim // 2}] of its "
                f"dtype (head_dim even), got {tuple(cos.shape)}"
            )
        status = getattr(self.library, "rotary_" + DTYPE_SUFFIXES[x.dtype])(
            x.data_ptr(),
            x.stride(0),
            cos.data_ptr(),
            sin.data_ptr(),
            tokens,
            heads,
            head_dim,
            torch.get_num_threads(),
        )
        check_status(status, "rotary", f"{tokens} tokens of {heads} heads of {head_dim}")
