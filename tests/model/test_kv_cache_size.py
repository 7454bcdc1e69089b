"""The CPU KV pool when ``max_num_blocks`` is not given: ``kv_cache_memory``, or a share of the memory
the weights leave, at most what the admitted sequences can use; an explicit ``max_num_blocks`` is the
pool exactly, as before. Memory is injected: nothing here depends on this machine's."""

from __future__ import annotations

import logging

import pytest

from hetero_core.default_plugins import torch_memory
from hetero_core.errors import ConfigError
from hetero_core.llm import LLM
from hetero_core.model.cpu.kv_cache_size import (
    DEFAULT_NUM_BLOCKS,
    KV_MEMORY_CAP,
    KV_MEMORY_FRACTION,
    kv_pool_size,
)
from hetero_core.model.cpu.memory_budget import MemoryBudget
from hetero_core.model.cpu.weight_size import CheckpointTensors
from hetero_core.settings import load_settings

GIB, MIB = 1 << 30, 1 << 20
BUDGET = MemoryBudget(10 * GIB, "MemAvailable in /proc/meminfo")


def size(**overrides):
    values = dict(
        bytes_per_block=MIB,
        block_size=16,
        max_num_seqs=256,
        max_model_len=2048,
        budget=BUDGET,
        weight_bytes=2 * GIB,
    )
    return kv_pool_size(**{**values, **overrides})


def test_a_share_of_the_memory_the_weights_leave():
    pool = size()
    assert pool.num_blocks == int(KV_MEMORY_FRACTION * 8 * GIB) // MIB == 4096
    assert "50% of the memory" in pool.reason and "8.00 GiB left" in pool.reason


def test_a_pool_sized_from_memory_takes_at_most_the_cap():
    pool = size(budget=MemoryBudget(64 * GIB, "a large machine"))
    assert pool.num_blocks == KV_MEMORY_CAP // MIB == 4096
    assert "cap" in pool.reason
    assert size(budget=MemoryBudget(64 * GIB, "a large machine"), kv_cache_memory=6 * GIB).num_blocks == 6144


def test_at_most_what_the_admitted_sequences_can_use():
    pool = size(max_num_seqs=4, max_model_len=100)
    assert pool.num_blocks == 4 * 7 and "max_num_seqs x max_model_len" in pool.reason


def test_kv_cache_memory_is_the_pool_and_must_fit():
    assert size(kv_cache_memory=3 * GIB).num_blocks == 3072
    with pytest.raises(ConfigError, match="kv_cache_memory = 9.00 GiB does not fit"):
        size(kv_cache_memory=9 * GIB)
    with pytest.raises(ConfigError, match="holds no KV block"):
        size(kv_cache_memory=1000)


def test_no_memory_left_is_a_clear_error_and_unknown_memory_the_old_default():
    with pytest.raises(ConfigError, match="no memory is left for the KV cache"):
        size(weight_bytes=11 * GIB)
    assert size(budget=None).num_blocks == DEFAULT_NUM_BLOCKS


def test_settings_take_a_size_string_and_refuse_both():
    assert load_settings(None, kv_cache_memory="4GiB").kv_cache_memory == 4 * GIB
    assert not load_settings(None).max_num_blocks_given
    assert load_settings(None, max_num_blocks=1024).max_num_blocks_given
    with pytest.raises(ConfigError, match="kv_cache_memory"):
        load_settings(None, kv_cache_memory="lots")
    with pytest.raises(ConfigError, match="one of max_num_blocks and kv_cache_memory"):
        load_settings(None, kv_cache_memory="4GiB", max_num_blocks=64)


def engine_blocks(model_dir, **settings) -> int:
    common = dict(executor="torch", tokenizer="byte", max_model_len=256, max_num_seqs=8, max_tokens=3)
    llm = LLM(model=str(model_dir), **{**common, **settings})
    try:
        assert not llm.generate([[5, 6, 7, 8]], use_tqdm=False)[0].failed
        return llm.engine.stats().num_blocks
    finally:
        llm.shutdown()


@pytest.fixture
def fake_memory(monkeypatch):
    def fake(available_bytes: int) -> None:
        budget = MemoryBudget(available_bytes, "a fake cgroup's memory.max minus usage")
        monkeypatch.setattr(torch_memory, "memory_budget", lambda: budget)

    return fake


def test_the_engine_pool_follows_the_memory_and_explicit_blocks_stay_exact(
    tiny_model_dirs, fake_memory, caplog
):
    model_dir = tiny_model_dirs["llama"][0]
    fake_memory(64 * GIB)
    with caplog.at_level(logging.INFO, logger="hetero"):
        assert engine_blocks(model_dir) == 8 * 16  # 8 sequences of 256 tokens: all they can use
    assert any("kv_cache.sized" in r.getMessage() for r in caplog.records)
    assert engine_blocks(model_dir, max_num_blocks=40) == 40
    # the tiny Llama in fp32: 2 layers x 2 heads x 16 wide x (K and V) x 4 bytes x 16 tokens = 8 KiB a block
    assert engine_blocks(model_dir, kv_cache_memory=80 * 1024, dtype="float32") == 10
    fake_memory(MIB)  # 1 MiB: the 256 MiB working set alone does not fit
    with pytest.raises(ConfigError, match="no memory is left for the KV cache"):
        engine_blocks(model_dir, dtype="float32")


def test_kv_cache_memory_with_an_executor_that_does_not_size_its_pool_is_refused():
    with pytest.raises(ConfigError, match="executor 'mock' here does not size its pool"):
        LLM(executor="mock", kv_cache_memory="1GiB")


def test_a_draft_models_pool_stays_its_own_size_when_the_targets_is_sized_from_memory(
    tiny_model_dirs, fake_memory
):
    from hetero_core.default_plugins.draft import DraftProposer
    from hetero_core.default_plugins.draft_options import DraftProposerOptions
    from hetero_core.executor import ExecutorContext
    from hetero_core.speculative import ProposerContext

    fake_memory(64 * GIB)
    model_dir = tiny_model_dirs["llama"][0]
    settings = load_settings(executor="torch", model=str(model_dir), max_model_len=256)
    assert not settings.max_num_blocks_given
    target = ExecutorContext(settings, None, model_dir, 1024, 16, 256, 512, 8, None, 96)
    ctx = ProposerContext(
        options=DraftProposerOptions(model=str(model_dir), dtype="float32", num_blocks=24),
        num_speculative_tokens=2,
        vocab_size=96,
        model_dir=model_dir,
        executor="torch",
        block_size=16,
        max_model_len=256,
        max_num_seqs=8,
        cache_dir=settings.cache_dir,
        target_executor=target,
    )
    proposer = DraftProposer(ctx)
    assert proposer.pool.num_blocks == 24
    assert proposer.executor.kv_caches[0].key.shape[1] == 24  # [heads, blocks, block_size, head_dim]


class _CodedTensors(CheckpointTensors):
    """A GGUF's tensors whose linear is Q4_K codes (the types injected: no file read)."""

    @property
    def code_types(self) -> dict[str, str]:
        return {"model.layers.0.mlp.up_proj.weight": "Q4_K"}


def test_a_gguf_pool_is_sized_from_the_memory_its_codes_leave():
    """The codes' bytes, not the dense fp32 bound: an 8B Q4_K_M in fp32 is ~9 GB of codes where its
    dense figure is ~30 GB, and a pool sized from the dense one finds no memory left."""
    from types import SimpleNamespace

    import torch

    from hetero_core.model.cpu.memory_fit import MemoryFit

    linear = 6 * GIB // 4  # 6 GiB in fp32, 0.89 GiB as Q4_K codes (2,432 bytes per 4,096 weights)
    tensors = _CodedTensors({"model.layers.0.mlp.up_proj.weight": linear}, tied_embeddings=False)
    budget = MemoryBudget(5 * GIB, "a test's budget")
    fit = MemoryFit(tensors, budget, kv_bytes_per_token=MIB // 16, max_model_len=256, block_codes=True)
    settings = SimpleNamespace(max_num_blocks_given=False, max_num_seqs=10_000, kv_cache_memory=None)
    ctx = SimpleNamespace(settings=settings, block_size=16, max_model_len=256)
    pool = torch_memory.kv_pool(ctx, fit, torch.float32)
    left = 5 * GIB - fit.weight_bytes("float32", codes=True) - fit.working_set_bytes("float32", codes=True)
    assert fit.weight_bytes("float32", codes=True) == linear * 2432 // 4096
    assert pool.num_blocks == int(KV_MEMORY_FRACTION * left) // MIB  # 1 MiB blocks (16 tokens)
