"""Test helper: hand-built paged ``Batch`` objects, with a tiny block allocator.

``PagedSequence`` knows all its tokens up front (prompt plus the tokens we will feed as "decoded"),
so a test can compare each step's logits with one full-sequence HF forward.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hetero_core.engine.batch import Batch


class BlockPool:
    """Hands out block ids; ``shuffle=True`` makes block tables non-contiguous and unordered."""

    def __init__(self, num_blocks: int, shuffle: bool = False, seed: int = 0):
        self.free = list(range(num_blocks))
        if shuffle:
            random.Random(seed).shuffle(self.free)

    def take(self) -> int:
        return self.free.pop(0)


@dataclass
class PagedSequence:
    seq_id: int
    token_ids: list[int]  # every token this sequence will ever process
    num_prompt_tokens: int
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)


def step(segments: list[tuple[PagedSequence, int]], pool: BlockPool, block_size: int) -> Batch:
    """One batch: each ``(seq, num_new_tokens)`` processes its next tokens; all are sampled when
    they reach the end of the prompt or beyond. Advances each sequence's ``num_computed``."""
    fields: dict[str, list] = {k: [] for k in (
        "seq_ids", "token_ids", "positions", "slot_mapping", "context_lens", "block_tables",
        "is_prefill", "sample", "num_prompt_tokens", "seeds")}
    query_start_loc = [0]
    for seq, num_new in segments:
        start, end = seq.num_computed, seq.num_computed + num_new
        while len(seq.block_table) * block_size < end:
            seq.block_table.append(pool.take())
        for pos in range(start, end):
            fields["token_ids"].append(seq.token_ids[pos])
            fields["positions"].append(pos)
            block = seq.block_table[pos // block_size]
            fields["slot_mapping"].append(block * block_size + pos % block_size)
        query_start_loc.append(query_start_loc[-1] + num_new)
        fields["seq_ids"].append(seq.seq_id)
        fields["context_lens"].append(end)
        fields["block_tables"].append(list(seq.block_table))
        fields["is_prefill"].append(start < seq.num_prompt_tokens)
        fields["sample"].append(end >= seq.num_prompt_tokens)
        fields["num_prompt_tokens"].append(seq.num_prompt_tokens)
        fields["seeds"].append(None)
        seq.num_computed = end
    return Batch(query_start_loc=query_start_loc, block_size=block_size, **fields)
