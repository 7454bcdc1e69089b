"""Hand-built paged batches for contract tests: sequences that know all their tokens up front.

A ``ContractSequence`` holds its prompt and the tokens it will be fed as "decoded" (teacher
forcing), so two schedules of the same sequences (chunked or not, batched or alone, contiguous or
shuffled blocks) must give the same output row at every sampled position.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hetero_core.engine.scheduling.batch import Batch, slot_of


class BlockPool:
    """Hands out block ids; ``shuffle=True`` makes block tables non-contiguous and out of order."""

    def __init__(self, num_blocks: int, shuffle: bool = False, seed: int = 0) -> None:
        self._free = list(range(num_blocks))
        if shuffle:
            random.Random(seed).shuffle(self._free)

    def take(self) -> int:
        if not self._free:
            raise RuntimeError("the contract's block pool is exhausted; raise num_blocks")
        return self._free.pop(0)


@dataclass
class ContractSequence:
    seq_id: int
    token_ids: list[int]  # every token this sequence will process: prompt, then fed tokens
    num_prompt_tokens: int
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)

    @property
    def num_remaining(self) -> int:
        return len(self.token_ids) - self.num_computed


def build_batch(segments: list[tuple[ContractSequence, int]], pool: BlockPool, block_size: int) -> Batch:
    """One step: each ``(seq, num_new)`` processes its next ``num_new`` tokens; a sequence is
    sampled when its segment reaches the end of the prompt or beyond. Advances ``num_computed``."""
    values: dict[str, list] = {
        k: []
        for k in (
            "seq_ids",
            "token_ids",
            "positions",
            "slot_mapping",
            "context_lens",
            "block_tables",
            "is_prefill",
            "sample",
            "num_prompt_tokens",
            "seeds",
        )
    }
    query_start_loc = [0]
    for seq, num_new in segments:
        start, end = seq.num_computed, seq.num_computed + num_new
        if num_new < 1 or end > len(seq.token_ids):
            raise ValueError(f"sequence {seq.seq_id}: cannot process tokens {start}..{end}")
        while len(seq.block_table) * block_size < end:
            seq.block_table.append(pool.take())
        for pos in range(start, end):
            values["token_ids"].append(seq.token_ids[pos])
            values["positions"].append(pos)
            values["slot_mapping"].append(slot_of(seq.block_table, pos, block_size))
        query_start_loc.append(query_start_loc[-1] + num_new)
        values["seq_ids"].append(seq.seq_id)
        values["context_lens"].append(end)
        values["block_tables"].append(list(seq.block_table))
        values["is_prefill"].append(start < seq.num_prompt_tokens)
        values["sample"].append(end >= seq.num_prompt_tokens)
        values["num_prompt_tokens"].append(seq.num_prompt_tokens)
        values["seeds"].append(None)
        seq.num_computed = end
    return Batch(query_start_loc=query_start_loc, block_size=block_size, **values)
