"""The draft model's steps as core ``Batch`` objects: one segment per sequence, every one sampled."""

from __future__ import annotations

from dataclasses import dataclass

from hetero_core.engine.scheduling.batch import Batch, slot_of


@dataclass(frozen=True)
class Segment:
    """Tokens ``token_ids`` of sequence ``seq_id`` at positions ``start``, ``start + 1``, ... over
    ``blocks``."""

    seq_id: int
    blocks: list[int]
    start: int
    token_ids: list[int]


def draft_batch(segments: list[Segment], block_size: int) -> Batch:
    """One step over ``segments``: each writes its tokens' K/V after its first ``start`` cached tokens and
    is sampled at its last token."""
    token_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    starts = [0]
    for segment in segments:
        for offset, token in enumerate(segment.token_ids):
            position = segment.start + offset
            token_ids.append(token)
            positions.append(position)
            slots.append(slot_of(segment.blocks, position, block_size))
        starts.append(len(token_ids))
    n = len(segments)
    return Batch(
        seq_ids=[s.seq_id for s in segments],
        token_ids=token_ids,
        positions=positions,
        slot_mapping=slots,
        query_start_loc=starts,
        context_lens=[s.start + len(s.token_ids) for s in segments],
        block_tables=[s.blocks for s in segments],
        is_prefill=[len(s.token_ids) > 1 for s in segments],
        sample=[True] * n,
        num_prompt_tokens=[s.start + len(s.token_ids) for s in segments],
        seeds=[None] * n,
        block_size=block_size,
    )
