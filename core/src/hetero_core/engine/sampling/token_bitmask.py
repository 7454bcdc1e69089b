"""Token bitmasks: which tokens a constrained row may sample, packed 32 tokens to an int32 word.

The layout is xgrammar's (and vLLM's): token ``t`` is allowed when bit ``t % 32`` of word ``t // 32``
of its row is set. A structured-output backend fills rows; the sampler applies them with
``apply_token_bitmask`` (pure torch: one unpack and one subtraction for the constrained rows); an
executor that picks tokens itself (the mock) reads a row with ``allowed_token_ids``.
"""

from __future__ import annotations

ALL_ALLOWED = -1  # an int32 word with every bit set


def num_words(vocab_size: int) -> int:
    """Words per row for ``vocab_size`` tokens."""
    return (vocab_size + 31) // 32


def allocate_token_bitmask(num_rows: int, vocab_size: int):
    """A ``[num_rows, num_words(vocab_size)]`` int32 tensor with every token allowed."""
    import torch

    return torch.full((num_rows, num_words(vocab_size)), ALL_ALLOWED, dtype=torch.int32)


def unpack_token_bitmask(bitmask, vocab_size: int):
    """The bool ``[rows, vocab_size]`` tensor of allowed tokens (a token beyond the mask's words is not)."""
    import torch

    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    allowed = bits.bool().reshape(bitmask.shape[0], -1)
    if allowed.shape[1] >= vocab_size:
        return allowed[:, :vocab_size]
    pad = torch.zeros(
        bitmask.shape[0], vocab_size - allowed.shape[1], dtype=torch.bool, device=bitmask.device
    )
    return torch.cat([allowed, pad], dim=1)


FORBIDDEN = 1e30  # subtracted from a forbidden token's score: exp() of it is 0, and no NaN can arise


def apply_token_bitmask(scores, bitmask) -> list[int]:
    """Push the scores of tokens the mask forbids down by ``FORBIDDEN`` (in place; rows of ``scores`` =
    rows of the mask; rows that allow everything are left alone). Returns the rows that allow no token.

    One subtraction of the unpacked bits as floats: several times faster on the CPU than
    ``masked_fill(-inf)`` (6-13 ms for 32 x 49,152 on one Zen 4 thread, against ~2.5 ms).
    """
    import torch

    bitmask = bitmask.to(scores.device)
    constrained = (bitmask != ALL_ALLOWED).any(dim=1)
    if not bool(constrained.any()):
        return []
    rows = None if bool(constrained.all()) else constrained.nonzero().flatten()
    words = bitmask if rows is None else bitmask[rows]
    shifts = torch.arange(32, dtype=torch.int32, device=words.device)
    forbidden = ((words.unsqueeze(-1).bitwise_not() >> shifts) & 1).reshape(words.shape[0], -1)
    forbidden = _fit(forbidden, scores.shape[1]).to(scores.dtype)
    if rows is None:
        scores.sub_(forbidden, alpha=FORBIDDEN)
    else:
        scores[rows] = scores[rows].sub_(forbidden, alpha=FORBIDDEN)
    none_allowed = (forbidden.amin(dim=1) > 0).nonzero().flatten()
    chosen = none_allowed if rows is None else rows[none_allowed]
    return chosen.tolist()


def _fit(bits, width: int):
    """``bits`` cut or padded (with 1: forbidden) to ``width`` columns."""
    import torch

    if bits.shape[1] >= width:
        return bits[:, :width]
    pad = torch.ones(bits.shape[0], width - bits.shape[1], dtype=bits.dtype, device=bits.device)
    return torch.cat([bits, pad], dim=1)


def allowed_token_ids(row_words, vocab_size: int | None = None) -> list[int]:
    """The allowed token ids (below ``vocab_size``, if given) of one row, from its words (ints or a
    1-D tensor)."""
    words = row_words.tolist() if hasattr(row_words, "tolist") else list(row_words)
    out = []
    for i, word in enumerate(words):
        word &= 0xFFFFFFFF
        while word:
            low = word & -word
            out.append(i * 32 + low.bit_length() - 1)
            word ^= low
    return out if vocab_size is None else [t for t in out if t < vocab_size]
