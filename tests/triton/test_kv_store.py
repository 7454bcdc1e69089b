"""The KV-store kernel writes each new token's K/V at its slot and nothing else."""

from __future__ import annotations

import pytest
import torch

from hetero_plugins_triton.kernels.kv_store import store_kv


@pytest.mark.parametrize("num_kv_heads, head_dim", [(2, 32), (1, 48), (3, 16)])
def test_writes_rows_at_slots_and_skips_padding(num_kv_heads, head_dim, mode, dtype):
    num_slots, num_tokens = 8 * 16, 11
    generator = torch.Generator().manual_seed(1)
    # K and V as the model produces them: non-contiguous head views of one fused projection.
    fused = torch.randn(num_tokens, 3 + 2 * num_kv_heads, head_dim, generator=generator)
    fused = fused.to(device=mode.device, dtype=dtype)
    key, value = fused[:, 3 : 3 + num_kv_heads], fused[:, 3 + num_kv_heads :]
    slots = torch.randperm(num_slots, generator=generator)[:num_tokens]
    slots[4] = -1  # padding: nothing written
    key_cache = torch.full((8, 16, num_kv_heads, head_dim), float("nan"), dtype=dtype, device=mode.device)
    value_cache = torch.full_like(key_cache, float("nan"))

    store_kv(
        key,
        value,
        key_cache,
        value_cache,
        slots.to(device=mode.device, dtype=torch.int32),
        interpret=mode.interpret,
    )

    written = torch.cat([slots[:4], slots[5:]])
    rows = torch.cat([torch.arange(4), torch.arange(5, num_tokens)])
    flat_k, flat_v = key_cache.view(num_slots, -1).cpu(), value_cache.view(num_slots, -1).cpu()
    assert torch.equal(flat_k[written], key[rows].reshape(len(rows), -1).cpu())
    assert torch.equal(flat_v[written], value[rows].reshape(len(rows), -1).cpu())
    untouched = torch.ones(num_slots, dtype=torch.bool)
    untouched[written] = False
    assert flat_k[untouched].isnan().all() and flat_v[untouched].isnan().all()


def test_rejects_a_cache_of_another_dtype(mode):
    key = torch.zeros(2, 1, 16, device=mode.device)
    cache = torch.zeros(4, 16, 1, 16, dtype=torch.float16, device=mode.device)
    with pytest.raises(ValueError, match="new K/V are torch.float32 but the cache holds torch.float16"):
        store_kv(
            key,
            key,
            cache,
            cache,
            torch.zeros(2, dtype=torch.int32, device=mode.device),
            interpret=mode.interpret,
        )
