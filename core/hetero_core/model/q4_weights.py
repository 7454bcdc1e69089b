"""Find fp32 weights that are exactly 4-bit block codes (GGUF's Q4_1), and pack them for ``q4_linear``.

A Q4_1 checkpoint dequantizes each weight to ``d * q + m``: per block of 32 inputs an f16 scale ``d``
and minimum ``m``, per weight a code ``q`` in 0..15. ``d * q`` is exact in fp32, so the dequantized
value is a single rounding of ``d * q + m``, which the kernel reproduces bit for bit. The converted
checkpoint holds only the fp32 values; ``q4_1_codes`` recovers ``d``, ``m`` and ``q`` from them (``m``
is the block's minimum, the code-0 weight; ``d`` is (max - min) / 15 rounded to f16, or one f16 step
either side) and checks that every weight comes back exactly. Any other tensor (a full-precision
checkpoint, another quantization) is left as it is: None.
"""

from __future__ import annotations

import torch

BLOCK = 32  # inputs per block
PANEL = 16  # output columns per panel (the kernels' layout)
BLOCK_BYTES = 2 * PANEL * 4 + BLOCK * PANEL // 2  # d[16], m[16] fp32, then 16 pairs of inputs x 16 bytes
_PROBE_ROWS = 64  # rows checked first, so most tensors that are not Q4_1 are refused cheaply


def q4_1_codes(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``weight`` [N, K] fp32 -> ``(d, m, q)``: [N, K / 32] fp32 twice and [N, K / 32, 32] uint8 codes
    with ``d * q + m == weight`` exactly; None where ``weight`` is not such a tensor."""
    if weight.dtype != torch.float32 or weight.dim() != 2 or weight.shape[1] % BLOCK or weight.numel() == 0:
        return None
    if weight.shape[0] > _PROBE_ROWS and _codes(weight[:_PROBE_ROWS]) is None:
        return None
    return _codes(weight)


def _codes(weight: torch.Tensor):
    blocks = weight.detach().reshape(weight.shape[0], -1, BLOCK)
    low, high = blocks.amin(dim=-1), blocks.amax(dim=-1)
    if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
        return None
    if not torch.equal(low.half().float(), low):  # m is an f16 value (and the code-0 weight)
        return None
    nearest = ((high - low) / 15).half()
    found_d = torch.full_like(low, float("nan"))
    found_q = torch.zeros(blocks.shape, dtype=torch.uint8)
    for d16 in (nearest, torch.nextafter(nearest, torch.full_like(nearest, float("inf"))),
                torch.nextafter(nearest, torch.zeros_like(nearest))):
        d = d16.float()
        q = torch.round((blocks - low[..., None]) / torch.where(d > 0, d, 1)[..., None]).clamp_(0, 15)
        exact = torch.eq(d[..., None] * q + low[..., None], blocks).all(dim=-1) & torch.isnan(found_d)
        found_d = torch.where(exact, d, found_d)
        found_q[exact] = q[exact].to(torch.uint8)
    if torch.isnan(found_d).any():
        return None
    return found_d, low, found_q


def pack_q4_panels(d: torch.Tensor, m: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``q4_1_codes``'s output (rows in the kernel's column order; N a multiple of 16) -> the
    ``q4_linear`` layout, [N / 16, K / 32, BLOCK_BYTES] uint8."""
    rows, blocks = d.shape
    panels = rows // PANEL

    def per_panel(t: torch.Tensor) -> torch.Tensor:  # [N, B, ...] -> [N / 16, B, 16, ...]
        return t.reshape(panels, PANEL, blocks, *t.shape[2:]).transpose(1, 2)

    scales = torch.cat([per_panel(d), per_panel(m)], dim=-1).contiguous().view(torch.uint8)  # [P, B, 128]
    codes = per_panel(q).transpose(2, 3)  # [P, B, 32 inputs, 16 columns]
    nibbles = codes[:, :, 0::2] | (codes[:, :, 1::2] << 4)  # [P, B, 16 pairs of inputs, 16 columns]
    return torch.cat([scales, nibbles.reshape(panels, blocks, -1)], dim=-1).contiguous()
