"""Weights for the kernel tests: what Q4_1 and Q8_0 checkpoints dequantize to (exact block codes)."""

from __future__ import annotations

import torch


def q4_1_weight(out_features: int, in_features: int, seed: int = 0) -> torch.Tensor:
    """What a Q4_1 checkpoint dequantizes to: d * q + m per block of 32 inputs (f16 d and m, q in
    0..15, each block using codes 0 and 15 as the quantizer does)."""
    generator = torch.Generator().manual_seed(seed)
    blocks = in_features // 32
    d = (torch.rand(out_features, blocks, generator=generator) * 0.02 + 1e-3).half().float()
    m = (torch.rand(out_features, blocks, generator=generator) * -0.15).half().float()
    q = torch.randint(0, 16, (out_features, blocks, 32), generator=generator).float()
    q[..., 3], q[..., 17] = 0, 15
    return (d[..., None] * q + m[..., None]).reshape(out_features, in_features)


def q8_0_weight(out_features: int, in_features: int, seed: int = 0) -> torch.Tensor:
    """What a Q8_0 checkpoint dequantizes to: d * q per block of 32 inputs (f16 d, q in -127..127,
    each block reaching +-127 as the quantizer's scale max |w| / 127 makes it)."""
    generator = torch.Generator().manual_seed(seed)
    blocks = in_features // 32
    d = (torch.rand(out_features, blocks, generator=generator) * 0.002 + 1e-4).half().float()
    q = torch.randint(-127, 128, (out_features, blocks, 32), generator=generator).float()
    q[..., 9] = torch.where(torch.rand(out_features, blocks, generator=generator) < 0.5, -127.0, 127.0)
    return (d[..., None] * q).reshape(out_features, in_features)


CODED_WEIGHTS = {"q4_1": (q4_1_weight, torch.uint8), "q8_0": (q8_0_weight, torch.int8)}
