"""DeepSeek's RoPE: over the ``qk_rope_head_dim`` slice of each query head and the one shared RoPE
key, with YaRN scaling (the frequencies and the cos/sin factor as transformers computes them) and
DeepSeek's softmax-scale correction (``mscale_all_dim``).

DeepSeek rotates adjacent pairs ``(x0, x1), (x2, x3), ...``. ``apply_rotary`` writes each rotated
pair back as ``[even..., odd...]`` (the rotate-half layout): queries and keys get the same
permutation, so their dot products are those of the interleaved layout, and the cache holds keys in
this layout.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from hetero_core.model.mla.config import MLAConfig


class DeepseekRotary:
    """``cos_sin(positions)`` once per step -> ``[num_tokens, 1, rope_dim // 2]`` each, already
    multiplied by YaRN's attention factor. ``inv_freq`` stays fp32 (a runner moves it to its device)."""

    def __init__(self, config: MLAConfig):
        self.inv_freq, self.attention_factor = rope_parameters(
            config.qk_rope_head_dim, config.rope_theta, config.rope_scaling
        )

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = self.inv_freq
        if inv_freq.device != positions.device:
            inv_freq = inv_freq.to(positions.device)
        freqs = positions.float()[:, None, None] * inv_freq[None, None, :]
        return (freqs.cos() * self.attention_factor).to(dtype), (freqs.sin() * self.attention_factor).to(
            dtype
        )


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """``x`` [num_tokens, heads, rope_dim] (any strides) -> rotated, contiguous, in the rotate-half
    layout. ``interleave``: the pairs are adjacent dimensions (DeepSeek); else the two halves."""
    if interleave:
        first, second = x[..., 0::2], x[..., 1::2]
    else:
        half = x.shape[-1] // 2
        first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def softmax_scale(config: MLAConfig) -> float:
    """``qk_head_dim ** -0.5``, times ``mscale(factor, mscale_all_dim) ** 2`` under YaRN (as DeepSeek)."""
    scale = config.qk_head_dim**-0.5
    scaling = config.rope_scaling
    if scaling is not None and scaling.get("mscale_all_dim"):
        mscale = _mscale(float(scaling["factor"]), float(scaling["mscale_all_dim"]))
        scale *= mscale * mscale
    return scale


def rope_parameters(dim: int, theta: float, scaling: dict[str, Any] | None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [dim // 2] fp32, attention factor for cos/sin): plain RoPE or YaRN."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    if scaling is None:
        return 1.0 / (theta**exponents), 1.0
    factor = float(scaling["factor"])
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _mscale(factor, mscale) / _mscale(factor, mscale_all_dim)
        else:
            attention_factor = _mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1
    original = float(scaling["original_max_position_embeddings"])

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2, device="cpu").float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # the share of the extrapolated (unscaled) frequency
    return interpolation * (1 - keep) + extrapolation * keep, float(attention_factor)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
