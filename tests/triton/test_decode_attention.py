"""Split-K flash decoding against a dense float64 reference over shuffled paged caches."""

from __future__ import annotations

import pytest
import torch

from hetero_plugins_triton.kernels.decode_attention import decode_attention
from tests.triton.paged_reference import (
    TOLERANCE,
    gather,
    padded,
    random_cache,
    reference_attention,
    shuffled_block_tables,
)

HEAD_DIM = 32


def run_decode(
    mode,
    dtype,
    *,
    block_size,
    num_heads,
    num_kv_heads,
    context_lens,
    num_splits,
    head_dim=HEAD_DIM,
    block_n=16,
    share_first_block=(),
):
    num_blocks = sum(-(-n // block_size) for n in context_lens) + 3
    key_cache, value_cache = random_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype, mode.device)
    tables = shuffled_block_tables(context_lens, block_size, num_blocks, share_first_block=share_first_block)
    num_seqs = len(context_lens)
    # One extra flat row (the last) belongs to no decode sequence: it must stay poisoned.
    query = torch.randn(num_seqs + 1, num_heads, head_dim, generator=torch.Generator().manual_seed(2))
    query = query.to(device=mode.device, dtype=dtype)
    rows = list(range(num_seqs))[::-1]  # sequence i's token is at flat row num_seqs - 1 - i
    out = torch.full_like(query, float("nan"))
    scale = head_dim**-0.5
    decode_attention(
        query,
        key_cache,
        value_cache,
        padded(tables, mode.device),
        torch.tensor(context_lens, dtype=torch.int32, device=mode.device),
        torch.tensor(rows, dtype=torch.int32, device=mode.device),
        out,
        scale=scale,
        num_splits=num_splits,
        block_n=block_n,
        interpret=mode.interpret,
    )
    assert out[num_seqs].isnan().all(), "a row outside the decode group was written"
    for i, (row, n) in enumerate(zip(rows, context_lens)):
        expected = reference_attention(
            query[row : row + 1],
            gather(key_cache, tables[i], n),
            gather(value_cache, tables[i], n),
            [n - 1],
            scale,
        )[0]
        error = (out[row].double() - expected).abs().max().item()
        assert error < TOLERANCE[dtype], f"sequence {i} (context {n}): max error {error}"


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize(
    "num_heads, num_kv_heads", [(4, 4), (4, 2), (6, 2), (4, 1)], ids=["mha", "gqa", "gqa3", "mqa"]
)
@pytest.mark.parametrize("num_splits", [1, 2, 5])
def test_ragged_contexts_match_reference(block_size, num_heads, num_kv_heads, num_splits, mode, dtype):
    # 1 token, exactly a block, a block + 1, many blocks; sequences 1 and 3 share a prefix block.
    context_lens = [1, block_size, block_size + 1, 5 * block_size + 3]
    run_decode(
        mode,
        dtype,
        block_size=block_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        context_lens=context_lens,
        num_splits=num_splits,
        share_first_block=[(1, 3)],
    )


def test_head_dim_that_is_not_a_power_of_two_and_wide_tiles(mode, dtype):
    run_decode(
        mode,
        dtype,
        block_size=16,
        num_heads=4,
        num_kv_heads=2,
        context_lens=[7, 100],
        num_splits=3,
        head_dim=48,
        block_n=64,
    )


def test_more_splits_than_a_short_sequence_has_tiles(mode, dtype):
    # 9 splits over 2 tiles: seven splits get no tokens and must not disturb the merge.
    run_decode(mode, dtype, block_size=16, num_heads=2, num_kv_heads=1, context_lens=[20, 3], num_splits=9)


def test_rejects_mismatched_shapes(mode):
    query = torch.zeros(1, 3, 32, device=mode.device)
    cache = torch.zeros(2, 16, 2, 32, device=mode.device)
    with pytest.raises(ValueError, match="num_heads a multiple of num_kv_heads"):
        decode_attention(
            query,
            cache,
            cache,
            torch.zeros(1, 1, dtype=torch.int32, device=mode.device),
            torch.ones(1, dtype=torch.int32, device=mode.device),
            torch.zeros(1, dtype=torch.int32, device=mode.device),
            torch.empty_like(query),
            scale=1.0,
            num_splits=1,
            block_n=16,
            interpret=mode.interpret,
        )
