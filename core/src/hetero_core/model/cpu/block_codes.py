"""Find fp32 weights that are exact block codes (GGUF's Q4_1 and Q8_0), for ``coded_linear``.

A quantized checkpoint dequantizes each weight from a code and per-block constants (blocks of 32
inputs): Q4_1 as ``d * q + m`` (f16 ``d`` and ``m``, ``q`` in 0..15), Q8_0 as ``d * q`` (f16 ``d``,
``q`` in -127..127). ``d * q`` is exact in fp32, so the dequantized value is a single rounding of
``d * q + m``, which the kernel reproduces bit for bit. The converted checkpoint holds only the fp32
values; ``block_codes`` recovers the codes from them and checks that every weight comes back exactly:

- Q4_1: ``m`` is the block's minimum (the weight of code 0), ``d`` is (max - min) / 15 rounded to f16;
- Q8_0: ``d`` is max |w| / 127 rounded to f16 (``m`` = 0);

trying ``d``'s f16 neighbours where rounding went the other way. Any other tensor (a full-precision
checkpoint, another quantization) is left as it is: None. ``code_panels`` packs what is found.
"""

from __future__ import annotations

import torch

BLOCK = 32  # inputs per block
_PROBE_ROWS = 64  # rows checked first, so most tensors that are not codes are refused cheaply


def block_codes(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None:
    """``weight`` [N, K] fp32 -> ``(d, m, q, bits)``: [N, K / 32] fp32 twice, [N, K / 32, 32] codes
    (uint8 for 4 bits, int8 for 8) with ``d * q + m == weight`` exactly; None for any other tensor."""
    if not _code_shaped(weight):
        return None
    for codes in (_q4_1, _q8_0):
        if weight.shape[0] > _PROBE_ROWS and codes(weight[:_PROBE_ROWS]) is None:
            continue
        found = codes(weight)
        if found is not None:
            return found
    return None


def may_be_block_codes(weight: torch.Tensor) -> bool:
    """False where ``block_codes`` is certainly None for ``weight`` with its rows in any order: its first
    rows are neither format's codes (every block of a weight must be), checked without reordering it."""
    if not _code_shaped(weight):
        return False
    head = weight[:_PROBE_ROWS]
    return any(codes(head) is not None for codes in (_q4_1, _q8_0))


def _code_shaped(weight: torch.Tensor) -> bool:
    """An fp32 matrix, not empty, whose rows are whole blocks: the only tensors codes can be found in."""
    return (
        weight.dtype == torch.float32
        and weight.dim() == 2
        and weight.shape[1] % BLOCK == 0
        and weight.numel() > 0
    )


def _q4_1(weight: torch.Tensor):
    blocks = weight.detach().reshape(weight.shape[0], -1, BLOCK)
    low, high = blocks.amin(dim=-1), blocks.amax(dim=-1)
    if not torch.equal(low.half().float(), low):  # m is an f16 value (and the code-0 weight)
        return None
    found = _find_scales(blocks, (high - low) / 15, low, 0, 15)
    return None if found is None else (found[0], low, found[1].to(torch.uint8), 4)


def _q8_0(weight: torch.Tensor):
    blocks = weight.detach().reshape(weight.shape[0], -1, BLOCK)
    zero = torch.zeros(blocks.shape[:2])
    found = _find_scales(blocks, blocks.abs().amax(dim=-1) / 127, zero, -127, 127)
    return None if found is None else (found[0], zero, found[1].to(torch.int8), 8)


def _find_scales(blocks, estimate, m, lowest: int, highest: int):
    """Per block the f16 ``d`` (the estimate rounded to f16, or one step either side) and codes in
    ``[lowest, highest]`` with ``d * q + m == blocks`` exactly; None if some block has none."""
    if not (torch.isfinite(estimate).all() and torch.isfinite(m).all()):
        return None
    nearest = estimate.half()
    found_d = torch.full_like(m, float("nan"))
    found_q = torch.zeros(blocks.shape)
    for d16 in (
        nearest,
        torch.nextafter(nearest, torch.full_like(nearest, float("inf"))),
        torch.nextafter(nearest, torch.zeros_like(nearest)),
    ):
        d = d16.float()
        q = torch.round((blocks - m[..., None]) / torch.where(d > 0, d, 1)[..., None]).clamp_(lowest, highest)
        exact = torch.eq(d[..., None] * q + m[..., None], blocks).all(dim=-1) & torch.isnan(found_d)
        found_d = torch.where(exact, d, found_d)
        found_q[exact] = q[exact]
    if torch.isnan(found_d).any():
        return None
    return found_d, found_q
