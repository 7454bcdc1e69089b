"""Find fp32 weights that are exact block codes (GGUF's Q4_1 and Q8_0), and pack them for ``coded_linear``.

A quantized checkpoint dequantizes each weight from a code and per-block constants (blocks of 32
inputs): Q4_1 as ``d * q + m`` (f16 ``d`` and ``m``, ``q`` in 0..15), Q8_0 as ``d * q`` (f16 ``d``,
``q`` in -127..127). ``d * q`` is exact in fp32, so the dequantized value is a single rounding of
``d * q + m``, which the kernel reproduces bit for bit. The converted checkpoint holds only the fp32
values; ``block_codes`` recovers the codes from them and checks that every weight comes back exactly:

- Q4_1: ``m`` is the block's minimum (the weight of code 0), ``d`` is (max - min) / 15 rounded to f16;
- Q8_0: ``d`` is max |w| / 127 rounded to f16 (``m`` = 0);

trying ``d``'s f16 neighbours where rounding went the other way. Any other tensor (a full-precision
checkpoint, another quantization) is left as it is: None.
"""

from __future__ import annotations

import torch

BLOCK = 32  # inputs per block
PANEL = 16  # output columns per panel (the kernels' layout)
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


CODES_Q4, CODES_Q8, CODES_Q8_SUB16 = 4, 8, 9  # csrc/code_blocks.h's formats


def pack_code_panels(d: torch.Tensor, m: torch.Tensor, q: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes of blocks of 32 inputs -> the layout ``coded_linear`` and ``q8a_coded_linear`` read
    (``csrc/code_blocks.h``). ``d``, ``m``: [N, K / 32] fp32; ``q``: [N, K / 32, 32] codes with
    ``w = d * q + m``: ``bits`` 4, q in 0..15 (Q4_1, Q4_K's sub-blocks with m = -dmin * min), or 8, q
    in -128..127 (Q8_0 with m = 0); rows in the kernel's column order, N a multiple of 16.

    Returns [N / 16, K / 32, bytes]: per panel of 16 columns and block, d[16] and m[16] fp32, then the
    codes as VPDPBUSD takes them, per 64-byte vector 16 columns x 4 consecutive inputs (384 bytes,
    uint8, for 4-bit codes: input 16 + i in the high nibble beside input i; 640 for 8-bit ones, stored
    as q + 128, int8: the dtype tells a packed weight's format)."""
    rows, blocks = d.shape
    panels = rows // PANEL
    scales = torch.cat([_per_panel(d, panels), _per_panel(m, panels)], dim=-1)  # [P, B, 32] fp32
    if bits == 4:
        codes = q.to(torch.uint8)
        codes = codes[:, :, :16] | (codes[:, :, 16:] << 4)  # [N, B, 16]: inputs i and 16 + i
    else:
        codes = (q.to(torch.int16) + 128).to(torch.uint8)  # [N, B, 32]
    packed = torch.cat([scales.contiguous().view(torch.uint8), _quads(codes, panels)], dim=-1).contiguous()
    return packed if bits == 4 else packed.view(torch.int8)


def pack_code_panels_sub16(d: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """8-bit codes with a scale per 16 inputs (GGUF Q6_K: ``d`` = the super-block's f16 d times the
    sub-block's int8 scale, exact in fp32; ``q`` = the 6-bit code - 32) -> the layout ``coded_linear``
    and ``q8a_coded_linear`` read as format CODES_Q8_SUB16 (``csrc/code_blocks.h``).

    ``d``: [N, K / 16] fp32; ``q``: [N, K / 16, 16] int8 (any value -128..127) with ``w = d * q``; rows
    in the kernel's column order (``swiglu_order`` for a fused gate/up weight), N a multiple of 16, K
    of 16. Returns [N / 16, K / 16, 320] int8: per panel of 16 columns and sub-block d[16] fp32, then
    the codes as q + 128, per 64-byte vector 16 columns x 4 consecutive inputs (the shape, 320 bytes
    per block of 16, tells it from ``pack_code_panels``'s formats)."""
    rows, blocks = d.shape
    if q.shape != (rows, blocks, 16) or rows % PANEL:
        raise ValueError(
            f"pack_code_panels_sub16: d [N, K / 16] and q [N, K / 16, 16] with N a multiple of "
            f"16, got d {tuple(d.shape)}, q {tuple(q.shape)}"
        )
    panels = rows // PANEL
    codes = (q.to(torch.int16) + 128).to(torch.uint8)
    scales = _per_panel(d.float(), panels).contiguous().view(torch.uint8)  # [P, B, 64]
    return torch.cat([scales, _quads(codes, panels)], dim=-1).contiguous().view(torch.int8)


def _per_panel(t: torch.Tensor, panels: int) -> torch.Tensor:
    """[N, B, ...] -> [N / 16, B, 16, ...] (then the last two flattened: column-major per block)."""
    out = t.reshape(panels, PANEL, t.shape[1], *t.shape[2:]).transpose(1, 2)
    return out.reshape(*out.shape[:2], -1)


def _quads(codes: torch.Tensor, panels: int) -> torch.Tensor:
    """Bytes [N, B, S] (S per column and block) -> [N / 16, B, S * 16]: S / 4 vectors of 16 columns x 4."""
    rows, blocks, size = codes.shape
    grouped = codes.reshape(panels, PANEL, blocks, size // 4, 4).permute(0, 2, 3, 1, 4)  # [P, B, S/4, 16, 4]
    return grouped.reshape(panels, blocks, size * PANEL)
