"""Test helper: the same step plan run on two executors, with identical block assignments."""

from __future__ import annotations

from tests.model.paged_batches import BlockPool, PagedSequence, step

TOKENS = [(7 * i + 3) % 90 + 2 for i in range(120)]


def mixed_plan():
    """Sequences and steps covering every path: fresh prefills (one not sampled: a first chunk),
    a continued prefill beside a decode, then pure decodes of 3 sequences (padded to 4)."""
    seqs = [
        PagedSequence(1, TOKENS[:46], 40),
        PagedSequence(2, TOKENS[10:66], 50),
        PagedSequence(3, TOKENS[30:53], 17),
    ]
    a, b, c = seqs
    steps = [[(a, 40), (b, 20)], [(a, 1), (b, 30), (c, 17)]] + [[(a, 1), (b, 1), (c, 1)]] * 5
    return seqs, steps


def run_plan(executor, block_size: int = 16, num_blocks: int = 64):
    """Logits (fp32 CPU) of every step of ``mixed_plan`` on ``executor``."""
    _, steps = mixed_plan()
    pool = BlockPool(num_blocks, shuffle=True, seed=3)
    return [executor.execute(step(segments, pool, block_size)).logits for segments in steps]
