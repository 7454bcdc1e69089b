"""The torch paged backend's per-step metadata: what each kind of sequence costs in memory."""

from __future__ import annotations

import pytest
import torch

from hetero_core.model.cpu.torch_attention import TorchPagedAttention
from tests.model.paged_batches import BlockPool, PagedSequence, step

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


def _random_decode_step(num_kv_heads: int, group_size: int, head_dim: int, dtype: torch.dtype, backend=None):
    """Six sequences of different lengths (one exactly a block, one a single token) decoding
    together: returns (backend, metadata, query, key, value, kv_cache, context_lens)."""
    torch.manual_seed(0)
    pool = BlockPool(64)
    lengths = [1, 5, 16, 17, 40, 63]
    seqs = [PagedSequence(i, list(range(n)), n - 1) for i, n in enumerate(lengths)]
    prefill = [(s, n - 1) for s, n in zip(seqs, lengths, strict=True) if n > 1]
    step(prefill, pool, BLOCK_SIZE)
    batch = step([(s, 1) for s in seqs], pool, BLOCK_SIZE)
    backend = backend or TorchPagedAttention()
    cache = backend.allocate_kv_cache(1, 64, BLOCK_SIZE, num_kv_heads, head_dim, dtype, CPU)[0]
    cache.key.copy_(torch.randn(cache.key.shape))  # earlier tokens' K/V, garbage in unused slots
    cache.value.copy_(torch.randn(cache.value.shape))
    num_heads = num_kv_heads * group_size
    query = torch.randn(len(seqs), num_heads, head_dim).to(dtype)
    key = torch.randn(len(seqs), num_kv_heads, head_dim).to(dtype)
    value = torch.randn(len(seqs), num_kv_heads, head_dim).to(dtype)
    return backend, backend.build_metadata(batch, CPU), query, key, value, cache, lengths


def _reference_decode(query, cache, metadata, lengths):
    """fp64 attention of each sequence over the slots of its block table (the step's own K/V
    already stored), computed one sequence at a time."""
    num_heads, head_dim = query.shape[1:]
    num_kv_heads = cache.key.shape[0]  # head-major: [kv_heads, blocks, block_size, dim]
    keys = cache.key.double().view(num_kv_heads, -1, head_dim).transpose(0, 1)  # [slots, kv_heads, dim]
    values = cache.value.double().view(num_kv_heads, -1, head_dim).transpose(0, 1)
    tables = metadata.decode.block_index.view(len(lengths), -1)
    outputs = []
    for row, length in enumerate(lengths):
        slots = torch.stack(
            [tables[row, p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(length)]
        )
        k = keys[slots].repeat_interleave(num_heads // num_kv_heads, dim=1)  # [length, heads, dim]
        v = values[slots].repeat_interleave(num_heads // num_kv_heads, dim=1)
        scores = torch.einsum("hd,lhd->hl", query[row].double(), k) * head_dim**-0.5
        outputs.append(torch.einsum("hl,lhd->hd", scores.softmax(-1), v))
    return torch.stack(outputs)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.bfloat16, 0.05)])
@pytest.mark.parametrize("num_kv_heads, group_size", [(3, 3), (2, 1)])
@pytest.mark.parametrize("path", ["torch", "kernel"])
def test_decode_attention_matches_a_per_sequence_reference(
    dtype, tolerance, num_kv_heads, group_size, path, request
):
    """The torch path (grouped matmuls over gathered blocks) and the compiled kernel (reading the
    blocks in place) both attend exactly the sequence's context (padding and other sequences'
    blocks ignored), grouped query heads included."""
    kernels = request.getfixturevalue("cpu_kernels") if path == "kernel" else None
    backend = TorchPagedAttention(cpu_kernels=kernels)
    backend, metadata, query, key, value, cache, lengths = _random_decode_step(
        num_kv_heads, group_size, 16, dtype, backend
    )
    out = backend.forward(query, key, value, cache, metadata, scale=16**-0.5)
    assert out.shape == query.shape and out.dtype == dtype
    expected = _reference_decode(query, cache, metadata, lengths)
    assert (out.double() - expected).abs().max() < tolerance
