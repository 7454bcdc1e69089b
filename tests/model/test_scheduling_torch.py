"""Scheduling invariance on a real model: a tiny random Llama through the torch executor gives the
same greedy and seeded tokens with the prefix cache on or off, under chunked prefill, when a tiny
pool forces preemption by recompute or by swap, and with async scheduling."""

from __future__ import annotations

import pytest

from hetero_core.builder import build_engine
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.settings import load_settings

SYSTEM = [5, 17, 33, 2, 48, 71, 9, 64, 12, 88, 40, 3, 27, 55, 61, 19, 7, 90, 14, 36]  # 20 tokens
PROMPTS = [SYSTEM + [10 + i, 20 + i, 30 + i] * (1 + i % 3) for i in range(6)]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from tests.model.tiny_models import save_tiny_model

    directory = tmp_path_factory.mktemp("sched") / "llama"
    save_tiny_model("llama", directory)
    return directory


def make_engine(model_dir, **overrides):
    settings = load_settings(
        model=str(model_dir), executor="torch", tokenizer="byte", block_size=4, max_model_len=128, **overrides
    )
    return build_engine(settings, load_plugins(entry_points=[]))


def outputs(engine, params):
    return [o.output_token_ids for o in engine.generate(PROMPTS, params)]


GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
SEEDED = SamplingParams(temperature=1.0, top_k=20, seed=1234, max_tokens=12, ignore_eos=True)


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_same_tokens_with_cache_chunks_and_preemption(tiny_llama, params):
    reference = outputs(make_engine(tiny_llama, enable_prefix_caching=False), params)
    variants = {
        "cache, one by one": None,
        "chunked": dict(max_prefill_chunk=5, max_total_tokens=24),
        "recompute": dict(max_num_blocks=24, memory_threshold=1.0, preemption_mode="recompute"),
        "swap": dict(max_num_blocks=24, memory_threshold=1.0, preemption_mode="swap", num_swap_blocks=64),
        "async, chunked": dict(async_scheduling=True, max_prefill_chunk=5, max_total_tokens=24),
        "async, swap": dict(
            async_scheduling=True,
            max_num_blocks=24,
            memory_threshold=1.0,
            preemption_mode="swap",
            num_swap_blocks=64,
        ),
    }
    for name, overrides in variants.items():
        if overrides is None:  # each request after the previous one: the system prompt is a hit
            engine = make_engine(tiny_llama)
            got = [engine.generate([p], params)[0].output_token_ids for p in PROMPTS]
            assert engine.stats().prefix_cache_hit_tokens >= 5 * 20, name
        else:
            engine = make_engine(tiny_llama, **overrides)
            got = outputs(engine, params)
        assert got == reference, name
        if name.endswith(("recompute", "swap")):
            stats = engine.stats()
            assert stats.num_preemptions > 0, name
            assert (stats.num_swap_preemptions > 0) == name.endswith("swap")
        engine.shutdown()


def test_copy_and_swap_move_whole_blocks(tiny_llama):
    import torch

    engine = make_engine(tiny_llama, preemption_mode="swap", num_swap_blocks=8, max_num_blocks=16)
    executor = engine.executor
    for cache in executor.kv_caches:
        for tensor in cache:
            tensor.copy_(torch.randn_like(tensor))
    key = executor.kv_caches[1].key  # head-major: [kv_heads, blocks, block_size, dim]
    original = key[:, 3].clone()
    executor.copy_blocks([(3, 9)])
    assert torch.equal(key[:, 9], original)
    executor.swap_out([(3, 5)])
    key[:, 3].zero_()
    executor.swap_in([(5, 3)])
    assert torch.equal(key[:, 3], original)
    assert (
        executor.runner.kv_cache.swap_space[1][0].shape[1] == 8
    )  # the swap space has num_swap_blocks blocks
