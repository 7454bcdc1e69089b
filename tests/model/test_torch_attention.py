"""The torch paged backend's per-step metadata: what each kind of sequence costs in memory."""

from __future__ import annotations

import torch

from hetero_core.model.torch_attention import TorchPagedAttention
from paged_batches import BlockPool, PagedSequence, step

BLOCK_SIZE = 16
CPU = torch.device("cpu")


def test_each_kind_of_sequence_gets_only_the_indices_it_needs():
    fresh = PagedSequence(1, list(range(4000)), num_prompt_tokens=4000)
    chunked = PagedSequence(2, list(range(100)), num_prompt_tokens=100)
    decoding = PagedSequence(3, list(range(50)), num_prompt_tokens=10)
    pool = BlockPool(512)
    step([(chunked, 60), (decoding, 10)], pool, BLOCK_SIZE)
    for _ in range(30):
        step([(decoding, 1)], pool, BLOCK_SIZE)
    batch = step([(decoding, 1), (fresh, 4000), (chunked, 40)], pool, BLOCK_SIZE)
    metadata = TorchPagedAttention().build_metadata(batch, CPU)

    fresh_segment, chunked_segment = metadata.prefills
    # A prompt with nothing cached attends its own new K/V: no gather indices, no mask.
    assert (fresh_segment.start, fresh_segment.end) == (1, 4001)
    assert fresh_segment.context_slots is None and fresh_segment.mask is None
    # A chunk after 60 cached tokens: 100 context slots and a causal mask shifted by 60.
    assert chunked_segment.context_slots.tolist() == [
        chunked.block_table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(100)
    ]
    assert chunked_segment.mask.shape == (40, 100)
    assert chunked_segment.mask[0].sum() == 61 and chunked_segment.mask[-1].all()
    # The decode: whole blocks of its table, and a key mask over the 41 tokens in context.
    decode = metadata.decode
    assert decode.token_index.tolist() == [0] and decode.num_seqs == 1
    assert decode.block_index.tolist() == decoding.block_table
    assert decode.key_mask.shape == (1, 1, 1, len(decoding.block_table) * BLOCK_SIZE)
    assert decode.key_mask.sum() == 41


def test_a_pure_decode_step_keeps_tokens_in_order_and_pads_block_tables():
    pool = BlockPool(64)
    short, long = PagedSequence(1, list(range(20)), 19), PagedSequence(2, list(range(60)), 59)
    step([(short, 19), (long, 59)], pool, BLOCK_SIZE)
    metadata = TorchPagedAttention().build_metadata(step([(short, 1), (long, 1)], pool, BLOCK_SIZE), CPU)
    assert metadata.prefills == () and metadata.decode.token_index is None
    assert metadata.decode.block_index.tolist() == short.block_table + [0, 0] + long.block_table
    assert metadata.decode.key_mask.sum(-1).flatten().tolist() == [20, 60]
