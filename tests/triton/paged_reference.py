"""Test helpers: random paged KV caches with shuffled block tables, and a dense float64 reference."""

from __future__ import annotations

import random

import torch

# Tolerances against the float64 reference, by dtype.
TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def random_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype, device, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key = torch.randn(shape, generator=generator).to(device=device, dtype=dtype)
    value = torch.randn(shape, generator=generator).to(device=device, dtype=dtype)
    return key, value


def shuffled_block_tables(context_lens, block_size, num_blocks, seed=0, share_first_block=()):
    """Non-contiguous, unordered block tables; each pair in ``share_first_block`` (i, j) makes sequence
    ``j`` start with sequence ``i``'s first block (a shared prefix block)."""
    free = list(range(num_blocks))
    random.Random(seed).shuffle(free)
    tables = [[free.pop() for _ in range(-(-n // block_size))] for n in context_lens]
    for i, j in share_first_block:
        tables[j][0] = tables[i][0]
    return tables


def padded(tables, device) -> torch.Tensor:
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device)


def gather(cache, table, context_len) -> torch.Tensor:
    """The first ``context_len`` tokens of a sequence, ``[context_len, num_kv_heads, head_dim]``."""
    block_size = cache.shape[1]
    slots = [table[p // block_size] * block_size + p % block_size for p in range(context_len)]
    return cache.reshape(-1, *cache.shape[2:])[torch.tensor(slots, device=cache.device)]


def reference_attention(query, key, value, query_positions, scale) -> torch.Tensor:
    """float64 causal attention: ``query`` [q, H, D] at ``query_positions`` over ``key``/``value``
    [ctx, KVH, D] (position = index); query at position p sees keys 0..p."""
    group = query.shape[1] // key.shape[1]
    q = query.double()
    k = key.double().repeat_interleave(group, dim=1)
    v = value.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    positions = torch.tensor(query_positions, device=query.device)
    hidden = torch.arange(key.shape[0], device=query.device)[None, :] > positions[:, None]
    scores = scores.masked_fill(hidden[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
