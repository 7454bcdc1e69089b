"""Block codes packed in the layout the kernels' code linears read (``csrc/code_blocks.h``), and which of
its formats a packed weight is.

A weight's codes come with a scale ``d`` (and most with an offset ``m``) per row and block of inputs,
the weight being ``d * q + m`` in fp32. ``pack_codes`` lays them out in panels of 16 output columns,
each panel its blocks in input order, choosing the most compact format that holds exactly the same fp32
``d`` and ``m``, so the kernels' results are the same bits in every format:

- per block, fp32 scales: ``CODES_Q4`` (4-bit codes, blocks of 32, d and m), ``CODES_Q8`` (8-bit, d
  and m), ``CODES_Q8_SUB16`` (8-bit, blocks of 16, d only);
- per block, fp16 scales, where every ``d`` and ``m`` is an fp16 value (Q4_0, Q4_1, Q8_0, Q5_0 and the
  embedded model's codes): ``CODES_Q4_F16``, and ``CODES_Q8_F16`` where ``m`` is 0;
- per super-block of 256 inputs, where the scales are given as fp32 bases times small integer factors
  (``SuperScales``: the k-quants' f16 ``d``/``dmin`` and 6- or 8-bit sub-block scales):
  ``CODES_Q4_SUPER`` (Q4_K) and ``CODES_Q8_SUB16_SUPER`` (Q6_K).

Bytes per weight: Q4 0.75, Q4_F16 0.625, Q4_SUPER 0.59; Q8 1.25, Q8_F16 1.06; SUB16 1.25, SUB16_SUPER
1.08. The format of a packed tensor is told by its dtype (uint8: 4-bit codes; int8: 8-bit) and its
last dimension's bytes (``code_format``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PANEL = 16  # output columns per panel
SUPER = 256  # inputs per super-block (the k-quants' QK_K)
CODES_Q4, CODES_Q8, CODES_Q8_SUB16 = 4, 8, 9
CODES_Q4_F16, CODES_Q8_F16 = 20, 24
CODES_Q4_SUPER, CODES_Q8_SUB16_SUPER = 36, 41

# (dtype, bytes per unit) -> (format, inputs per unit): a unit is a block, or a super-block
_FORMATS = {
    (torch.uint8, 384): (CODES_Q4, 32),
    (torch.uint8, 320): (CODES_Q4_F16, 32),
    (torch.uint8, 2432): (CODES_Q4_SUPER, SUPER),
    (torch.int8, 640): (CODES_Q8, 32),
    (torch.int8, 320): (CODES_Q8_SUB16, 16),
    (torch.int8, 544): (CODES_Q8_F16, 32),
    (torch.int8, 4416): (CODES_Q8_SUB16_SUPER, SUPER),
}


@dataclass(frozen=True)
class SuperScales:
    """Scales given per row and super-block of 256 inputs: ``d`` [N, S] fp32 and ``d_factors`` [N, S,
    blocks] (uint8 for 4-bit codes' blocks of 32, int8 for blocks of 16), and for 4-bit codes ``m`` and
    ``m_factors`` the same; each block's scale is ``base * factor`` (exact in fp32 for the k-quants:
    an f16 value times at most 8 bits)."""

    d: torch.Tensor
    d_factors: torch.Tensor
    m: torch.Tensor | None = None
    m_factors: torch.Tensor | None = None

    def expanded(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The per-block ``(d, m)`` [N, S * blocks] these stand for (m None where there is none)."""
        d = (self.d[..., None] * self.d_factors.float()).reshape(self.d.shape[0], -1)
        if self.m is None:
            return d, None
        return d, (self.m[..., None] * self.m_factors.float()).reshape(self.m.shape[0], -1)


def code_format(packed: torch.Tensor) -> int:
    """The format (``CODES_*``) of a weight from ``pack_codes`` (or ``pack_code_panels*``)."""
    found = _FORMATS.get((packed.dtype, packed.shape[-1]))
    if found is None:
        raise ValueError(
            f"not a packed block-code weight: {str(packed.dtype).removeprefix('torch.')} "
            f"with {packed.shape[-1]} bytes per block"
        )
    return found[0]


def code_in_features(packed: torch.Tensor) -> int:
    """The inputs of a packed block-code weight: its blocks (or super-blocks) times their inputs."""
    return packed.shape[1] * _FORMATS[(packed.dtype, packed.shape[-1])][1]


def pack_codes(
    d: torch.Tensor,
    m: torch.Tensor | None,
    q: torch.Tensor,
    supers: SuperScales | None = None,
    compact: bool = True,
) -> torch.Tensor:
    """Codes -> the most compact format that holds exactly their fp32 ``d`` and ``m`` (``compact``
    False: the fp32-scale formats, the same results from more bytes). ``d``, ``m`` [N, B] fp32 (``m``
    None or zeros for codes without offsets); ``q`` [N, B, 32] uint8 (4-bit codes, 0..15) or int8, or
    [N, B, 16] int8 (blocks of 16, no ``m``); ``supers`` the same scales per super-block, used where
    they expand to ``d`` and ``m`` exactly. Rows in the kernel's column order, N a multiple of 16."""
    four, block = q.dtype == torch.uint8, q.shape[-1]
    has_m = m is not None and bool(m.any())
    if compact and supers is not None and _supers_exact(supers, d, m if has_m else None, q):
        return _pack_super(supers, q)
    if block == 16:
        if has_m:
            raise ValueError("pack_codes: codes in blocks of 16 have no offsets m")
        return pack_code_panels_sub16(d, q)
    if m is None:
        m = torch.zeros_like(d)
    if compact and _is_f16(d) and (four and _is_f16(m) or not four and not has_m):
        return _pack_f16(d, m, q, four)
    return pack_code_panels(d, m, q, 4 if four else 8)


def pack_code_panels(d: torch.Tensor, m: torch.Tensor, q: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes of blocks of 32 inputs -> formats CODES_Q4 (``bits`` 4: q 0..15, uint8) or CODES_Q8 (8: q
    -128..127): ``d``, ``m`` [N, K / 32] fp32, ``q`` [N, K / 32, 32], ``w = d * q + m``. Returns [N /
    16, K / 32, bytes]: per panel and block d[16] and m[16] fp32, then the codes as VPDPBUSD takes
    them, per 64-byte vector 16 columns x 4 consecutive inputs (384 bytes, uint8, for 4-bit codes:
    input 16 + i in the high nibble beside input i; 640, int8, for 8-bit ones, stored as q + 128)."""
    panels = _panels(d, q, 32)
    scales = torch.cat([_per_panel(d.float(), panels), _per_panel(m.float(), panels)], dim=-1)
    packed = torch.cat([scales.contiguous().view(torch.uint8), _code_bytes(q, bits == 4, panels)], dim=-1)
    return packed.contiguous() if bits == 4 else packed.contiguous().view(torch.int8)


def pack_code_panels_sub16(d: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """8-bit codes with a scale per 16 inputs (GGUF Q6_K: ``d`` the super-block's f16 d times the
    sub-block's int8 scale, ``q`` the 6-bit code - 32) -> format CODES_Q8_SUB16: ``d`` [N, K / 16]
    fp32, ``q`` [N, K / 16, 16] int8 with ``w = d * q``. Returns [N / 16, K / 16, 320] int8: per
    panel and block d[16] fp32, then the codes as q + 128 in CODES_Q8's vectors."""
    panels = _panels(d, q, 16)
    scales = _per_panel(d.float(), panels).contiguous().view(torch.uint8)
    return torch.cat([scales, _code_bytes(q, False, panels)], dim=-1).contiguous().view(torch.int8)


def _pack_f16(d: torch.Tensor, m: torch.Tensor, q: torch.Tensor, four: bool) -> torch.Tensor:
    """CODES_Q4_F16 (d[16], m[16] fp16 per block, 320 bytes) or CODES_Q8_F16 (d[16] fp16, 544)."""
    panels = _panels(d, q, 32)
    scales = [_per_panel(d.half(), panels)] + ([_per_panel(m.half(), panels)] if four else [])
    scales = torch.cat(scales, dim=-1).contiguous().view(torch.uint8)
    packed = torch.cat([scales, _code_bytes(q, four, panels)], dim=-1).contiguous()
    return packed if four else packed.view(torch.int8)


def _pack_super(supers: SuperScales, q: torch.Tensor) -> torch.Tensor:
    """CODES_Q4_SUPER or CODES_Q8_SUB16_SUPER: per panel and super-block the fp32 bases d[16] (m[16]),
    the factors per block [blocks][16] (d's, then m's), then the blocks' codes."""
    four, block = q.dtype == torch.uint8, q.shape[-1]
    per = SUPER // block
    panels = _panels(supers.d, q.reshape(q.shape[0], -1, SUPER), SUPER)
    rows, supers_count = supers.d.shape
    bases = [supers.d] + ([supers.m] if four else [])
    factors = [supers.d_factors] + ([supers.m_factors] if four else [])
    header = [_per_panel(b.float(), panels).contiguous().view(torch.uint8) for b in bases]
    for f in factors:  # [N, S, per] -> [P, S, per * 16]: per block its 16 columns
        f = f.reshape(panels, PANEL, supers_count, per).permute(0, 2, 3, 1)
        header.append(f.contiguous().view(torch.uint8).reshape(panels, supers_count, per * PANEL))
    codes = _code_bytes(q, four, panels).reshape(panels, supers_count, -1)
    packed = torch.cat([*header, codes], dim=-1).contiguous()
    return packed if four else packed.view(torch.int8)


def _supers_exact(supers: SuperScales, d: torch.Tensor, m: torch.Tensor | None, q: torch.Tensor) -> bool:
    """True where ``supers`` expand to ``d`` and ``m`` exactly, with factors of the type the format
    stores and whole super-blocks of 4-bit codes in blocks of 32 or 8-bit ones in blocks of 16."""
    four, block = q.dtype == torch.uint8, q.shape[-1]
    kind_fits = (four and block == 32 and supers.m is not None) or (
        not four and block == 16 and supers.m is None
    )
    factor_dtype = torch.uint8 if four else torch.int8
    if not kind_fits or supers.d_factors.dtype != factor_dtype:
        return False
    if supers.d_factors.shape[-1] != SUPER // block:
        return False
    if four and (supers.m_factors is None or supers.m_factors.dtype != factor_dtype):
        return False
    expanded_d, expanded_m = supers.expanded()
    if expanded_d.shape != d.shape or not torch.equal(expanded_d, d):
        return False
    if four:
        return torch.equal(expanded_m, m if m is not None else torch.zeros_like(d))
    return m is None


def _is_f16(t: torch.Tensor) -> bool:
    return bool(torch.equal(t.half().float(), t))


def _panels(d: torch.Tensor, q: torch.Tensor, block: int) -> int:
    rows = d.shape[0]
    if rows % PANEL or q.shape[:2] != d.shape[:2] or q.shape[-1] != block:
        raise ValueError(
            f"block codes: d [N, blocks] and q [N, blocks, {block}] with N a multiple of {PANEL}, got d "
            f"{tuple(d.shape)}, q {tuple(q.shape)}"
        )
    return rows // PANEL


def _code_bytes(q: torch.Tensor, four: bool, panels: int) -> torch.Tensor:
    """Codes [N, B, S] -> the panels' code bytes [P, B, bytes]: 4-bit codes of blocks of 32 with input
    16 + i in the high nibble beside input i; 8-bit ones as q + 128."""
    if four:
        codes = q.to(torch.uint8)
        codes = codes[:, :, :16] | (codes[:, :, 16:] << 4)
    else:
        codes = (q.to(torch.int16) + 128).to(torch.uint8)
    return _quads(codes, panels)


def _per_panel(t: torch.Tensor, panels: int) -> torch.Tensor:
    """[N, B, ...] -> [N / 16, B, 16, ...] (then the last two flattened: column-major per block)."""
    out = t.reshape(panels, PANEL, t.shape[1], *t.shape[2:]).transpose(1, 2)
    return out.reshape(*out.shape[:2], -1)


def _quads(codes: torch.Tensor, panels: int) -> torch.Tensor:
    """Bytes [N, B, S] (S per column and block) -> [N / 16, B, S * 16]: S / 4 vectors of 16 columns x 4."""
    rows, blocks, size = codes.shape
    grouped = codes.reshape(panels, PANEL, blocks, size // 4, 4).permute(0, 2, 3, 1, 4)  # [P, B, S/4, 16, 4]
    return grouped.reshape(panels, blocks, size * PANEL)
