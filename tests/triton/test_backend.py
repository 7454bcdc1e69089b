"""The Triton attention backend gives the torch reference backend's outputs and cache contents for
steps that mix fresh prefills, chunks continuing a cached prefix and decodes."""

from __future__ import annotations

import pytest
import torch

from hetero_core.model.cpu.torch_attention import TorchPagedAttention
from hetero_plugins_triton.backend import KernelSettings, TritonPagedAttention
from tests.model.paged_batches import BlockPool, PagedSequence, step

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 4, 2, 16, 16, 24


def run_steps(backend, caches, schedule, device, dtype):
    """Feed the same batches and random q/k/v to ``backend``; returns each step's output."""
    seqs = {i: PagedSequence(i, list(range(60)), num_prompt_tokens=n) for i, n in ((1, 40), (2, 9), (3, 3))}
    pool = BlockPool(NUM_BLOCKS, shuffle=True, seed=5)
    generator = torch.Generator().manual_seed(7)
    outputs = []
    for segments in schedule:
        batch = step([(seqs[i], n) for i, n in segments], pool, BLOCK_SIZE)
        shape = (batch.num_tokens, NUM_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM)
        qkv = torch.randn(shape, generator=generator).to(device=device, dtype=dtype)
        query, key, value = qkv[:, :NUM_HEADS], qkv[:, NUM_HEADS:-NUM_KV_HEADS], qkv[:, -NUM_KV_HEADS:]
        metadata = backend.build_metadata(batch, device)
        outputs.append(backend.forward(query, key, value, caches, metadata, HEAD_DIM**-0.5).float().cpu())
    return outputs, metadata


SCHEDULE = [
    [(1, 24), (2, 9), (3, 3)],  # fresh prefills; 1 is a first chunk
    [(2, 1), (1, 16), (3, 1)],  # decodes around a chunk that continues 24 cached tokens
    [(1, 1), (2, 1), (3, 1)],  # pure decode
    [(3, 1), (1, 1)],
]


@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_mixed_steps_match_the_torch_backend(num_splits, mode):
    dtype = torch.float32
    triton_backend = TritonPagedAttention(
        KernelSettings(
            interpret=mode.interpret,
            num_sms=4,
            num_splits=num_splits,
            decode_block_n=16,
            prefill_block_m=16,
            prefill_block_n=16,
        )
    )
    torch_backend = TorchPagedAttention()
    layouts = [
        b.allocate_kv_cache(1, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype, mode.device)[0]
        for b in (triton_backend, torch_backend)
    ]
    got, metadata = run_steps(triton_backend, layouts[0], SCHEDULE, mode.device, dtype)
    expected, _ = run_steps(torch_backend, layouts[1], SCHEDULE, mode.device, dtype)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert (a - b).abs().max().item() < 1e-4, f"step {i}"
    # Same cache contents: triton's [blocks, block_size, kv_heads, dim], torch's head-major
    # [kv_heads, blocks, ...]
    for triton_cache, torch_cache in zip(layouts[0], layouts[1], strict=True):
        assert torch.equal(triton_cache, torch_cache.permute(1, 2, 0, 3))
    assert metadata.prefill is None and metadata.decode.num_splits == (num_splits or 1)


def test_a_short_block_table_is_reported(mode):
    backend = TritonPagedAttention(KernelSettings(interpret=mode.interpret, num_sms=1, num_splits=None))
    batch = step([(PagedSequence(4, list(range(40)), 40), 40)], BlockPool(8), BLOCK_SIZE)
    broken = type(batch)(**{**batch.__dict__, "block_tables": [batch.block_tables[0][:2]]})
    with pytest.raises(ValueError, match="sequence 4: block table holds 32 slots but context_len is 40"):
        backend.build_metadata(broken, mode.device)
