"""References for ``q8a_coded_linear``'s tests: block codes in each format, the activations quantized as the
kernel quantizes them, and its arithmetic replayed in the same order.

``reference`` replays each output's fp32 chain (bias, then per weight block ``fma(d * sx, isum, y)``
and ``fma(m, sx * asum, y)``) with the integer sums computed exactly in int64 and each fused
multiply-add as one float64 operation rounded to fp32: the product of two fp32 values is exact in
float64, so the only difference from a real FMA is a double rounding, which lands on an fp32 tie
about once in 2^29 operations. Equality with it checks the integer sums and the order exactly.
"""

from __future__ import annotations

import torch

from hetero_core.model.cpu.code_panels import pack_code_panels, pack_code_panels_sub16

FORMATS = ("q4", "q8", "q8_sub16")


def random_codes(fmt: str, out_features: int, in_features: int, seed: int = 0):
    """``(d, m, q, packed)`` of a random weight in ``fmt``: d, m [N, blocks] fp32 (m None for
    q8_sub16), q [N, blocks, block] int64, and its packing."""
    g = torch.Generator().manual_seed(seed)
    if fmt == "q8_sub16":  # Q6_K-like: f16 d times an int8 scale per 16 inputs, q - 32 in -32..31 ...
        blocks = in_features // 16
        scale = torch.randint(-128, 128, (out_features, blocks), generator=g).float()
        d = (torch.rand(out_features, 1, generator=g) * 1e-3 + 1e-4).half().float() * scale
        q = torch.randint(-32, 32, (out_features, blocks, 16), generator=g)
        q[:, ::3, 5] = torch.randint(
            -128, 128, (out_features, q[:, ::3].shape[1]), generator=g
        )  # ... any int8
        return d, None, q, pack_codes(d, None, q)
    blocks = in_features // 32
    d = (torch.rand(out_features, blocks, generator=g) * 0.02 + 1e-3).half().float()
    if fmt == "q4":
        m = (torch.rand(out_features, blocks, generator=g) * -0.15).half().float()
        q = torch.randint(0, 16, (out_features, blocks, 32), generator=g)
        q[..., 3], q[..., 17] = 0, 15
        return d, m, q, pack_codes(d, m, q)
    m = torch.zeros(out_features, blocks)
    q = torch.randint(-128, 128, (out_features, blocks, 32), generator=g)
    q[..., 9], q[..., 30] = -128, 127  # the ends of the range (AVX2's |q| of -128 is 128)
    return d, m, q, pack_codes(d, m, q)


def pack_codes(d, m, q) -> torch.Tensor:
    """``random_codes``'s codes packed (any row order: ``swiglu_order`` them first for SwiGLU)."""
    if m is None:
        return pack_code_panels_sub16(d, q.to(torch.int8))
    four = bool((q >= 0).all() and (q < 16).all())
    return pack_code_panels(d, m, q.to(torch.uint8 if four else torch.int8), 4 if four else 8)


def dequantized(d, m, q) -> torch.Tensor:
    """The fp32 weight [N, K] the codes stand for (exact: d * q + m rounds once)."""
    w = d[..., None] * q.float()
    if m is not None:
        w = w + m[..., None]
    return w.reshape(q.shape[0], -1)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (a [M, K] int64 in -127..127, sx [M, K / 32] fp32) as the kernel: per block of 32,
    a = rint(x * (127 / max|x|)), sx = max|x| / 127, in fp32."""
    x = x.float()
    rows, k = x.shape
    blocks = x.reshape(rows, k // 32, 32)
    absmax = blocks.abs().amax(dim=-1)
    safe = torch.where(absmax > 0, absmax, torch.ones_like(absmax))
    inverse = torch.where(absmax > 0, torch.full_like(absmax, 127.0) / safe, torch.zeros_like(absmax))
    a = torch.round(blocks * inverse[..., None]).clamp_(-127, 127).to(torch.int64)
    return a.reshape(rows, k), absmax / 127.0


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return (a.double() * b.double() + c.double()).float()


def reference(x: torch.Tensor, d, m, q, bias: torch.Tensor | None) -> torch.Tensor:
    """The kernel's fp32 result for x [M, K], replayed (see the module docstring)."""
    a, sx = quantize_rows(x)
    rows, out_features, span = x.shape[0], q.shape[0], q.shape[2]
    y = torch.zeros(rows, out_features) if bias is None else bias.float().expand(rows, -1).clone()
    for b in range(q.shape[1]):
        inputs = slice(b * span, (b + 1) * span)
        isum = (a[:, inputs] @ q[:, b].T).float()  # [M, N], exact (int64, below 2^24)
        s = sx[:, b * span // 32, None]
        y = _fma(d[None, :, b] * s, isum, y)  # d * sx rounded to fp32 first, as the kernel
        if m is not None:
            asum = a[:, b * 32 : (b + 1) * 32].sum(dim=1, keepdim=True).float()
            y = _fma(m[None, :, b].expand(rows, -1), s * asum, y)
    return y
