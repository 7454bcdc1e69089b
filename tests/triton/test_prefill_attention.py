"""Paged varlen causal prefill against a dense float64 reference: fresh prompts, chunks continuing a
cached prefix, two sequences sharing a prefix block, GQA and MQA, block sizes 16 and 32."""

from __future__ import annotations

import pytest
import torch

from hetero_plugins_triton.kernels.prefill_attention import prefill_attention
from tests.triton.paged_reference import (
    TOLERANCE,
    gather,
    padded,
    random_cache,
    reference_attention,
    shuffled_block_tables,
)

HEAD_DIM = 32


def run_prefill(
    mode,
    dtype,
    *,
    block_size,
    num_heads,
    num_kv_heads,
    segments,
    block_m=32,
    block_n=32,
    head_dim=HEAD_DIM,
    share_first_block=(),
):
    """``segments``: (num_cached, query_len) per sequence; all K/V (cached and new) are in the cache."""
    context_lens = [cached + new for cached, new in segments]
    query_lens = [new for _, new in segments]
    num_blocks = sum(-(-n // block_size) for n in context_lens) + 2
    key_cache, value_cache = random_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype, mode.device)
    tables = shuffled_block_tables(context_lens, block_size, num_blocks, share_first_block=share_first_block)
    starts = [sum(query_lens[:i]) for i in range(len(segments))]
    query = torch.randn(sum(query_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(3))
    query = query.to(device=mode.device, dtype=dtype)
    out = torch.full_like(query, float("nan"))
    scale = head_dim**-0.5

    def ints(values):
        return torch.tensor(values, dtype=torch.int32, device=mode.device)

    prefill_attention(
        query,
        key_cache,
        value_cache,
        padded(tables, mode.device),
        ints(starts),
        ints(query_lens),
        ints(context_lens),
        out,
        max_query_len=max(query_lens),
        scale=scale,
        block_m=block_m,
        block_n=block_n,
        interpret=mode.interpret,
    )
    for i, ((cached, new), start) in enumerate(zip(segments, starts)):
        n = cached + new
        expected = reference_attention(
            query[start : start + new],
            gather(key_cache, tables[i], n),
            gather(value_cache, tables[i], n),
            list(range(cached, n)),
            scale,
        )
        error = (out[start : start + new].double() - expected).abs().max().item()
        assert error < TOLERANCE[dtype], f"sequence {i} {segments[i]}: max error {error}"


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 2), (6, 2), (4, 1)], ids=["gqa", "gqa3", "mqa"])
def test_fresh_and_continued_prefills_match_reference(block_size, num_heads, num_kv_heads, mode, dtype):
    segments = [
        (0, 1),  # a one-token prompt
        (0, block_size),  # exactly a block
        (0, 2 * block_size + 5),  # several query tiles
        (block_size, 5),  # a chunk continuing after exactly one cached block
        (2 * block_size + 3, 20),  # continuing mid-block, crossing into new blocks
        (block_size, block_size + 1),  # shares sequence 2's first block as its cached prefix
    ]
    run_prefill(
        mode,
        dtype,
        block_size=block_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        segments=segments,
        share_first_block=[(2, 5)],
    )


@pytest.mark.parametrize("block_m, block_n", [(16, 16), (16, 64)])
def test_tile_sizes_do_not_change_the_result(block_m, block_n, mode, dtype):
    run_prefill(
        mode,
        dtype,
        block_size=16,
        num_heads=4,
        num_kv_heads=2,
        segments=[(0, 37), (19, 30)],
        block_m=block_m,
        block_n=block_n,
    )


def test_head_dim_that_is_not_a_power_of_two(mode, dtype):
    run_prefill(mode, dtype, block_size=16, num_heads=2, num_kv_heads=1, segments=[(5, 18)], head_dim=48)


def test_rejects_a_tile_that_is_not_a_power_of_two(mode):
    query = torch.zeros(1, 2, 32, device=mode.device)
    cache = torch.zeros(2, 16, 1, 32, device=mode.device)
    ones = torch.ones(1, dtype=torch.int32, device=mode.device)
    with pytest.raises(ValueError, match="block_m 24 must be a power of two >= 16"):
        prefill_attention(
            query,
            cache,
            cache,
            ones[None],
            ones * 0,
            ones,
            ones,
            torch.empty_like(query),
            max_query_len=1,
            scale=1.0,
            block_m=24,
            block_n=16,
            interpret=mode.interpret,
        )
