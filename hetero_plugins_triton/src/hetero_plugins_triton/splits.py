"""How many KV splits flash decoding uses for a step."""

from __future__ import annotations

# Enough programs to keep every SM busy about twice over; below that, split the KV.
WAVES = 2
# A split shorter than this costs more in the merge than it saves.
MIN_TOKENS_PER_SPLIT = 128
MAX_SPLITS = 64


def choose_num_splits(
    *,
    max_context_len: int,
    num_seqs: int,
    num_kv_heads: int,
    num_sms: int,
    block_n: int,
    forced: int | None = None,
) -> int:
    """Splits per sequence for a decode step: ``forced`` if set, else from the longest context, the
    batch size and the device's SM count. Never more than the longest context has KV tiles."""
    num_tiles = max(1, -(-max_context_len // block_n))
    if forced is not None:
        return min(forced, num_tiles)
    programs = max(1, num_seqs * num_kv_heads)
    wanted = -(-WAVES * num_sms // programs)
    return max(1, min(wanted, max_context_len // MIN_TOKENS_PER_SPLIT, num_tiles, MAX_SPLITS))
