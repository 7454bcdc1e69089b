"""A GGUF tensor's raw blocks -> per-32-input-block codes ``(d, m, q)``, exactly as llama.cpp stores them.

The kernels' coded linear (``coded_linear``, ``csrc/f32_linear.c``) computes each weight as
``d * q + m`` in fp32, with ``d`` and ``m`` per row and block of 32 inputs and ``q`` a 4-bit (0..15) or
8-bit (int8) code. Every common GGUF type is that form with ``d * q`` exact in fp32 (a product of an f16
or ``f16 * 6-bit`` scale and a code of at most 6 bits), so ``d * q + m`` is one rounding, the same one
``gguf.quants.dequantize`` makes:

- Q4_0: ``d * (q - 8)``: ``d``, ``m = -8 d``, ``q`` 0..15 (``d * q - 8 d`` is exact: the value fits);
- Q4_1: ``d * q + m``, ``q`` 0..15;
- Q5_0: ``d * (q - 16)``: the 8-bit layout with ``q - 16`` as the code and ``m = 0``;
- Q5_1: ``d * q + m``, ``q`` 0..31 in the 8-bit layout;
- Q8_0: ``d * q``, ``q`` int8, ``m = 0``;
- Q4_K: super-blocks of 256 with eight 32-input sub-blocks, 6-bit scales and mins (``get_scale_min_k4``):
  ``d_eff = d * sc`` and ``m_eff = -(dmin * mn)`` (both exact in fp32), ``q`` 0..15;
- Q5_K: as Q4_K with a 5th bit per code (the 8-bit layout);
- Q6_K: super-blocks of 256 with sixteen 16-input sub-blocks, an int8 scale each: blocks of 16 inputs
  (``block`` 16, the kernels' CODES_Q8_SUB16 layout) with ``d_eff = d * sc`` (exact in fp32: 11 + 8
  significant bits), ``m = 0`` and the 6-bit code less 32 (-32..31) as the int8 ``q``; ``d_eff * q``
  has at most 24 significant bits, so it is exact too and the value is the reference's.

Equal means equal as fp32 values: where the reference's weight is a zero from a negative ``d`` times a
zero code (Q4_0, Q5_0, Q8_0: ``d * 0 = -0.0``) ours is ``-0.0 + 0.0 = +0.0``, which no sum can tell
apart. A block whose f16 scale is inf or NaN (no quantizer writes one) expands to NaN here where the
reference may give an inf.

Every other type (IQ*, Q2_K, Q3_K, TQ*, float types) has no codes: ``codes_of`` returns None for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK = 32  # inputs per code block (the kernels' layout; Q6_K's blocks are SUB_BLOCK)
SUB_BLOCK = 16  # inputs per Q6_K sub-block
SUPER_BLOCK = 256  # inputs per k-quant super-block (QK_K)


@dataclass(frozen=True)
class BlockCodes:
    """A [N, K] weight as codes: ``d``, ``m`` [N, K / B] fp32, ``q`` [N, K / B, B] (``bits`` 4: uint8
    0..15; 8: int8), the weight being ``d * q + m`` per block in fp32; B (``block``) is 32, or 16 for
    Q6_K (then ``m`` is 0 and ``bits`` 8). The k-quants also give their scales as the file stores them,
    per super-block of 256 inputs: ``base`` [N, K / 256, n] fp32 (Q4_K: d and -dmin, n = 2; Q6_K: d,
    n = 1) and ``factors`` [N, K / 256, n, blocks] (uint8 sub-block scales and mins; Q6_K's int8
    scales), ``d`` and ``m`` being ``base * factor`` exactly (what lets the kernels store 0.59 instead
    of 0.75 bytes a weight)."""

    d: np.ndarray
    m: np.ndarray
    q: np.ndarray
    bits: int
    base: np.ndarray | None = None
    factors: np.ndarray | None = None

    @property
    def block(self) -> int:
        """Inputs per block: 32, or 16 (Q6_K)."""
        return self.q.shape[-1]

    @property
    def shape(self) -> tuple[int, int]:
        return self.d.shape[0], self.d.shape[1] * self.block

    def values(self) -> np.ndarray:
        """The weight [N, K] in fp32, as the kernels expand it (one rounding of ``d * q + m``)."""
        out = self.d[..., None] * self.q.astype(np.float32) + self.m[..., None]
        return out.reshape(self.shape)

    def widened(self) -> BlockCodes:
        """The same weight in the 8-bit layout (4-bit codes as int8: 0..15 fit; no super-block scales,
        which the kernels store for 4-bit codes only)."""
        return self if self.bits == 8 else BlockCodes(self.d, self.m, self.q.astype(np.int8), 8)

    def rows_mapped(self, fn) -> BlockCodes:
        """The weight with ``fn`` (an operation on the first axis: a row order, a slice) applied to
        every per-row array."""
        base, factors = (None if t is None else fn(t) for t in (self.base, self.factors))
        return BlockCodes(fn(self.d), fn(self.m), fn(self.q), self.bits, base, factors)

    @staticmethod
    def concatenated(parts: list[BlockCodes]) -> BlockCodes:
        """Parts' rows one after another (mixed bits widened to 8; super-block scales kept where every
        part has them alike)."""
        if len(parts) == 1:
            return parts[0]
        if len({c.bits for c in parts}) > 1:
            parts = [c.widened() for c in parts]
        d, m, q = (np.concatenate([getattr(c, f) for c in parts]) for f in ("d", "m", "q"))
        base = factors = None
        if all(c.base is not None for c in parts) and len({c.factors.shape[1:] for c in parts}) == 1:
            base = np.concatenate([c.base for c in parts])
            factors = np.concatenate([c.factors for c in parts])
        return BlockCodes(d, m, q, parts[0].bits, base, factors)


def has_codes(type_name: str) -> bool:
    """True for the GGUF quantization types (by name: ``Q4_K``) that ``codes_of`` keeps as codes."""
    return type_name in _decoders()


def codes_of(raw: np.ndarray, type_name: str) -> BlockCodes | None:
    """The codes of a GGUF tensor's raw bytes ``raw`` ([N, bytes per row] uint8, as ``GGUFReader``
    gives a quantized tensor's ``data``) stored as ``type_name``; None for a type without codes."""
    decode = _decoders().get(type_name)
    if decode is None:
        return None
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    return decode(raw.reshape(raw.shape[0], -1))


def _decoders():
    """Type name -> decoder (raw [N, row bytes] -> BlockCodes)."""
    return {
        "Q4_0": _q4_0,
        "Q4_1": _q4_1,
        "Q5_0": _q5_0,
        "Q5_1": _q5_1,
        "Q8_0": _q8_0,
        "Q4_K": _q4_k,
        "Q5_K": _q5_k,
        "Q6_K": _q6_k,
    }


def _blocks(raw: np.ndarray, size: int) -> np.ndarray:
    """[N, row bytes] -> [N, blocks, size]."""
    if raw.shape[1] % size:
        raise ValueError(f"a row of {raw.shape[1]} bytes is not whole blocks of {size}")
    return raw.reshape(raw.shape[0], -1, size)


def _f16(raw: np.ndarray) -> np.ndarray:
    """[..., 2] bytes -> [...] fp32 (the little-endian f16 they hold)."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] codes 0..15: the low nibbles are inputs 0..15, the high ones 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """[..., 4] bytes (a little-endian uint32) -> [..., 32] bits: bit j is input j's fifth bit."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _q4_0(raw):
    blocks = _blocks(raw, 18)
    d = _f16(blocks[..., 0:2])
    return BlockCodes(d, -8 * d, _nibbles(blocks[..., 2:]), 4)


def _q4_1(raw):
    blocks = _blocks(raw, 20)
    return BlockCodes(_f16(blocks[..., 0:2]), _f16(blocks[..., 2:4]), _nibbles(blocks[..., 4:]), 4)


def _q5_0(raw):
    blocks = _blocks(raw, 22)
    q = _nibbles(blocks[..., 6:]) | (_high_bits(blocks[..., 2:6]) << 4)
    d = _f16(blocks[..., 0:2])
    return BlockCodes(d, np.zeros_like(d), (q.astype(np.int16) - 16).astype(np.int8), 8)


def _q5_1(raw):
    blocks = _blocks(raw, 24)
    q = _nibbles(blocks[..., 8:]) | (_high_bits(blocks[..., 4:8]) << 4)
    return BlockCodes(_f16(blocks[..., 0:2]), _f16(blocks[..., 2:4]), q.view(np.int8), 8)


def _q8_0(raw):
    blocks = _blocks(raw, 34)
    d = _f16(blocks[..., 0:2])
    return BlockCodes(d, np.zeros_like(d), np.ascontiguousarray(blocks[..., 2:]).view(np.int8), 8)


def _k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A Q4_K/Q5_K super-block's scales: ``base`` [N, S, 2] fp32 (its f16 ``d`` and ``-dmin``) and
    ``factors`` [N, S, 2, 8] uint8 (the 6-bit scales and mins of its 32-input sub-blocks), unpacked as
    llama.cpp's ``get_scale_min_k4`` (bytes 0-3: scales 0-3 in their low 6 bits, 4-7: mins 0-3; bytes
    8-11: scales 4-7 in the low nibble and mins 4-7 in the high one, their top 2 bits the top bits of
    bytes 0-3 and 4-7). A sub-block's d is ``d * sc``, its m ``-dmin * mn`` (both exact in fp32)."""
    d, dmin = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
    scales = blocks[..., 4:16]
    low, mid, top = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([low & 0x3F, (top & 0x0F) | ((low >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([mid & 0x3F, (top >> 4) | ((mid >> 2) & 0x30)], axis=-1)
    return np.stack([d, -dmin], axis=-1), np.stack([sc, mn], axis=-2)


def _k_low_nibbles(qs: np.ndarray) -> np.ndarray:
    """A k-quant super-block's 128 code bytes [N, S, 128] -> [N, S, 8, 32]: 32-byte group g holds
    sub-block 2g in its low nibbles and 2g + 1 in its high ones."""
    groups = qs.reshape(*qs.shape[:-1], 4, 32)
    return np.stack([groups & 0x0F, groups >> 4], axis=-2).reshape(*qs.shape[:-1], 8, 32)


def _k_codes(raw, size: int, low_at: int, high_at: int | None, bits: int) -> BlockCodes:
    blocks = _blocks(raw, size)
    rows, supers = blocks.shape[:2]
    base, factors = _k_scales(blocks)
    d_eff, m_eff = (base[..., i, None] * factors[..., i, :].astype(np.float32) for i in (0, 1))
    q = _k_low_nibbles(blocks[..., low_at : low_at + 128])
    if high_at is not None:  # Q5_K: bit i of byte j is sub-block i's input j's fifth bit
        qh = blocks[..., high_at : high_at + 32]
        q = q | (((qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1) << 4)
    q = q.reshape(rows, supers * 8, BLOCK)
    codes = q if bits == 4 else q.view(np.int8)
    return BlockCodes(d_eff.reshape(rows, -1), m_eff.reshape(rows, -1), codes, bits, base, factors)


def _q4_k(raw):
    return _k_codes(raw, 144, 16, None, 4)


def _q5_k(raw):
    return _k_codes(raw, 176, 48, 16, 8)


def _q6_k(raw):
    """Q6_K's 210-byte super-blocks: ``ql`` [128] (low nibbles), ``qh`` [64] (2-bit high parts),
    ``scales`` [16] int8, ``d`` f16. Each half of 128 inputs takes 64 ``ql`` bytes and 32 ``qh`` bytes:
    its input 32 g + l (g 0..3, l 0..31) is ``ql[l]``'s (g 0, 2) or ``ql[32 + l]``'s (g 1, 3) low (g < 2)
    or high nibble, with bits 2 g, 2 g + 1 of ``qh[l]`` on top; sub-block s (16 inputs) has scale s."""
    blocks = _blocks(raw, 210)
    rows, supers = blocks.shape[:2]
    ql = blocks[..., :128].reshape(rows, supers, 2, 2, 32)
    qh = blocks[..., 128:192].reshape(rows, supers, 2, 1, 32)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=-2)  # [N, S, half, g, l]
    high = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]) & 0x03
    q = ((low | (high << 4)).astype(np.int16) - 32).astype(np.int8).reshape(rows, supers * 16, SUB_BLOCK)
    scales = np.ascontiguousarray(blocks[..., 192:208]).view(np.int8)
    base = _f16(blocks[..., 208:210])[..., None]  # [N, S, 1]
    d = (base * scales.astype(np.float32)).reshape(rows, -1)
    return BlockCodes(d, np.zeros_like(d), q, 8, base, scales[..., None, :])
