"""The flash-attn test double against a dense float64 reference written from the documented
semantics, and its flash-attn-like refusals (so executor tests using it check real constraints)."""

from __future__ import annotations

import pytest
import torch

from tests.cuda.flash_attn_double import FlashAttnDouble

H, HK, D, PAGE = 4, 2, 16, 16


def reference(q, keys, values, scale):
    """One sequence, float64: ``q`` [sq, h, d], ``keys``/``values`` [sk, hk, d]; bottom-right causal."""
    q, keys, values = q.double(), keys.double(), values.double()
    sq, sk = q.shape[0], keys.shape[0]
    group = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, keys) * scale
    allowed = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + sk - sq
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)


def paged(keys_per_seq, num_blocks=12, seed=0):
    """Scatter each sequence's keys into a shuffled page pool: (cache, block_table int32)."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    cache = torch.randn(num_blocks, PAGE, HK, D, generator=gen)  # garbage outside the sequences
    width = max(-(-k.shape[0] // PAGE) for k in keys_per_seq)
    table = torch.zeros(len(keys_per_seq), width, dtype=torch.int32)
    for b, keys in enumerate(keys_per_seq):
        for j in range(-(-keys.shape[0] // PAGE)):
            block = order.pop()
            table[b, j] = block
            chunk = keys[j * PAGE : (j + 1) * PAGE]
            cache[block, : chunk.shape[0]] = chunk
    return cache, table


def test_varlen_fresh_and_paged_match_the_reference():
    double = FlashAttnDouble(page_block_multiple=PAGE, dtypes=(torch.float32,))
    q_lens, k_lens = [5, 1, 9], [5, 20, 33]  # seq 0 fresh, seq 1 a decode row, seq 2 a continued prefill
    gen = torch.Generator().manual_seed(1)
    qs = [torch.randn(n, H, D, generator=gen) for n in q_lens]
    ks = [torch.randn(n, HK, D, generator=gen) for n in k_lens]
    vs = [torch.randn(n, HK, D, generator=gen) for n in k_lens]
    cu_q = torch.tensor([0, 5, 6, 15], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 25, 58], dtype=torch.int32)
    k_cache, table = paged(ks)
    v_cache, _ = paged(vs)
    v_cache[:] = 0
    for b, values in enumerate(vs):  # the same pages for V
        for j in range(-(-values.shape[0] // PAGE)):
            chunk = values[j * PAGE : (j + 1) * PAGE]
            v_cache[table[b, j], : chunk.shape[0]] = chunk
    out = double.flash_attn_varlen_func(
        torch.cat(qs), k_cache, v_cache, cu_q, cu_k, 9, 33, softmax_scale=0.3, causal=True, block_table=table
    )
    expected = torch.cat([reference(q, k, v, 0.3) for q, k, v in zip(qs, ks, vs)])
    assert (out.double() - expected).abs().max() < 1e-5
    fresh = double.flash_attn_varlen_func(
        qs[0], ks[0], vs[0], cu_q[:2], cu_q[:2], 5, 5, softmax_scale=0.3, causal=True
    )
    assert (fresh.double() - reference(qs[0], ks[0], vs[0], 0.3)).abs().max() < 1e-5
    assert double.calls == {"varlen_paged": 1, "varlen": 1}


def test_with_kvcache_reads_cache_seqlens_tokens_through_the_block_table():
    double = FlashAttnDouble(page_block_multiple=PAGE, dtypes=(torch.float32,))
    k_lens = [1, 17, 40]
    gen = torch.Generator().manual_seed(2)
    ks = [torch.randn(n, HK, D, generator=gen) for n in k_lens]
    k_cache, table = paged(ks)
    v_cache = k_cache.flip(-1).contiguous()  # V differs from K but shares the pages
    q = torch.randn(3, 1, H, D, generator=gen)
    seqlens = torch.tensor(k_lens, dtype=torch.int32)
    out = double.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table, softmax_scale=0.25, causal=True
    )
    assert out.shape == (3, 1, H, D)
    for b, keys in enumerate(ks):
        expected = reference(q[b], keys, keys.flip(-1), 0.25)
        assert (out[b].double() - expected).abs().max() < 1e-5


def test_refuses_what_flash_attn_refuses():
    double = FlashAttnDouble()  # flash-attn 2.x: fp16/bf16, pages of 256
    q = torch.zeros(2, 1, H, D, dtype=torch.bfloat16)
    cache = torch.zeros(4, 16, HK, D, dtype=torch.bfloat16)
    seqlens = torch.ones(2, dtype=torch.int32)
    table = torch.zeros(2, 1, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="divisible by 256"):
        double.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=seqlens, block_table=table, causal=True)
    big = torch.zeros(2, 256, HK, D, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="block_table must have dtype torch.int32"):
        double.flash_attn_with_kvcache(q, big, big, cache_seqlens=seqlens, block_table=table.long())
    with pytest.raises(RuntimeError, match="only supports"):
        double.flash_attn_with_kvcache(
            q.float(), big.float(), big.float(), cache_seqlens=seqlens, block_table=table
        )
    with pytest.raises(NotImplementedError, match="k, v"):
        double.flash_attn_with_kvcache(q, big, big, k=q, v=q, cache_seqlens=seqlens, block_table=table)
    flat = torch.zeros(6, H, D, dtype=torch.bfloat16)
    cu = torch.tensor([0, 6], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="exceed max_seqlen"):
        double.flash_attn_varlen_func(flat, flat, flat, cu, cu, 4, 4, causal=True)
