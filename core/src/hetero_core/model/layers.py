"""Building blocks of the Llama family: RMSNorm, the SwiGLU MLP and rotary embeddings."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension, computed in fp32 (as HF does).

    ``forward(x)`` -> the normed ``x``; ``forward(x, residual)`` -> ``(norm(residual + x), residual + x)``,
    the decoder layer's skip connection fused with the norm that follows it (the sum is the next
    residual; ``residual`` itself may be overwritten with it). ``kernels``: the compiled CPU
    kernels (``cpu_kernels``) that do either in one pass; None: torch ops."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.kernels = None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        kernels = self.kernels
        if (
            kernels is not None
            and x.dim() == 2
            and kernels.handles(x, x.shape[1])
            and self.weight.dtype == x.dtype
        ):
            normed = kernels.rms_norm(x, self.weight, self.eps, residual)
            return normed if residual is None else (normed, residual)
        if residual is not None:
            residual = residual + x
            return self._norm(residual), residual
        return self._norm(x)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``, with gate and up as one matmul (see ``fusion``).
    ``kernels``: as for ``RMSNorm`` (SiLU-and-multiply in one pass)."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.kernels = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if getattr(self.gate_up_proj, "swiglu", False):  # a packed projection that applies the activation
            return self.down_proj(self.gate_up_proj(x))
        gate_up = self.gate_up_proj(x)
        if (
            self.kernels is not None
            and gate_up.dim() == 2
            and self.kernels.handles(gate_up, gate_up.shape[1] // 2)
        ):
            return self.down_proj(self.kernels.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate).mul_(up))


class RotaryEmbedding:
    """Rotate-half RoPE. ``cos_sin(positions)`` runs once per step; every layer reuses the result.

    The inverse frequencies stay an fp32 tensor (not a module buffer), so casting the model to bf16
    never degrades them; a ``ModelRunner`` moves them to its device once.
    """

    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any] | None):
        self.inv_freq = rope_inv_freq(head_dim, theta, scaling)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``[num_tokens, 1, head_dim // 2]`` each (both halves of a head share the frequencies)."""
        inv_freq = self.inv_freq
        if inv_freq.device != positions.device:  # a runner moves them to its device once
            inv_freq = inv_freq.to(positions.device)
        freqs = positions.float()[:, None, None] * inv_freq[None, None, :]
        return freqs.cos().to(dtype), freqs.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x``: [num_tokens, num_heads, head_dim] (any strides); returns a new contiguous tensor.

    Rotate-half written per half: ``[x1 cos - x2 sin, x2 cos + x1 sin]``.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out1, out2 = out[..., :half], out[..., half:]
    torch.mul(x1, cos, out=out1).addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=out2).addcmul_(x1, sin)
    return out


def use_cpu_kernels(model: nn.Module, kernels) -> int:
    """Hand ``kernels`` (``cpu_kernels.CpuKernels``) to every module of ``model`` that can use them;
    return how many."""
    modules = [module for module in model.modules() if hasattr(module, "kernels")]
    for module in modules:
        module.kernels = kernels
    return len(modules)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies for plain, ``linear`` and ``llama3`` RoPE (same math as transformers)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    if scaling["rope_type"] == "linear":
        return inv_freq / float(scaling["factor"])
    return _llama3_inv_freq(inv_freq, scaling)


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling["low_freq_factor"])
    high_freq_factor = float(scaling["high_freq_factor"])
    old_context_len = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor

    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)
