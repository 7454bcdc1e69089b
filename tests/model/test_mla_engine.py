"""MLA (DeepSeek-V2/V3) through the engine and the torch executor: the paged cache holds one latent
vector + RoPE key per token and layer (its bytes match the formula), greedy tokens equal Hugging
Face's over hundreds of tokens with the prefix cache, chunked prefill and preemption by recompute
and by swap, and both architectures pass core's architecture kit (logits, greedy, executor contract)."""

from __future__ import annotations

import pytest
import torch

from hetero_core.architectures import kv_bytes_per_token
from hetero_core.builder import build_engine
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.model.mla.architecture import mha_kv_layout, mla_kv_layout
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.settings import load_settings
from hetero_core.testing import ArchitectureContract
from tests.model.tiny_mla_models import YARN, build_tiny_mla_model, save_tiny_mla_model

SYSTEM = [5, 17, 33, 2, 48, 71, 9, 64, 12, 88, 40, 3, 27, 55, 61, 19, 7, 90, 14, 36]  # 20 tokens
PROMPTS = [SYSTEM + [10 + i, 20 + i, 30 + i] * (1 + i % 3) for i in range(4)]
NUM_TOKENS = 100  # per prompt: 400 greedy tokens per run


@pytest.fixture(scope="module")
def tiny_mla(tmp_path_factory):
    """name -> (directory, HF model): MLA with q compression and a MoE layer; MLA without either."""
    root = tmp_path_factory.mktemp("mla")
    return {
        "v2_moe": (
            root / "v2_moe",
            save_tiny_mla_model(
                "deepseek_v2_q_lora",
                root / "v2_moe",
                first_k_dense_replace=1,
                topk_method="group_limited_greedy",
                n_group=2,
                topk_group=1,
            ),
        ),
        "v2": (root / "v2", save_tiny_mla_model("deepseek_v2", root / "v2")),
    }


def hf_greedy(hf_model, prompt: list[int], num_tokens: int) -> list[int]:
    """HF's argmax, the whole sequence recomputed for each token (HF's own KV-cached generate orders
    its sums differently and, on these random weights, flips a near-tie in one of the prompts)."""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(num_tokens):
            tokens.append(int(hf_model(torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(prompt) :]


def make_engine(model_dir, **overrides):
    settings = load_settings(
        model=str(model_dir), executor="torch", tokenizer="byte", block_size=4, max_model_len=160, **overrides
    )
    return build_engine(settings, load_plugins(entry_points=[]))


GREEDY = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)


def test_greedy_equals_hf_with_prefix_hits_chunks_and_preemption(tiny_mla):
    """The architecture kit below covers chunks and preemption without the prefix cache; here the
    prefix cache is on in every variant (hits continue a cached latent prefix)."""
    model_dir, hf_model = tiny_mla["v2_moe"]
    reference = [hf_greedy(hf_model, p, NUM_TOKENS) for p in PROMPTS]
    variants = {
        "prefix hits, one by one": None,
        "chunked": dict(max_prefill_chunk=5, max_total_tokens=24),
        "recompute": dict(max_num_blocks=48, memory_threshold=1.0, preemption_mode="recompute"),
        "swap": dict(max_num_blocks=48, memory_threshold=1.0, preemption_mode="swap", num_swap_blocks=128),
    }
    for variant, overrides in variants.items():
        if overrides is None:  # each request after the previous one: the system prompt is a hit
            engine = make_engine(model_dir)
            got = [engine.generate([p], GREEDY)[0].output_token_ids for p in PROMPTS]
            assert engine.stats().prefix_cache_hit_tokens >= 3 * 20, variant
        else:
            engine = make_engine(model_dir, **overrides)
            got = [o.output_token_ids for o in engine.generate(PROMPTS, GREEDY)]
        assert got == reference, variant
        if variant in ("recompute", "swap"):
            stats = engine.stats()
            assert stats.num_preemptions > 0, variant
            assert (stats.num_swap_preemptions > 0) == (variant == "swap")
        engine.shutdown()


def test_the_cache_holds_one_latent_and_rope_key_per_token(tiny_mla):
    """Per layer one tensor [1, blocks, block_size, kv_lora_rank + rope_dim]; the value is a view of
    its first kv_lora_rank channels. Bytes per token: the layout's formula, far below plain MHA's."""
    engine = make_engine(tiny_mla["v2"][0], max_num_blocks=16)
    executor = engine.executor
    config = executor.model.config
    caches = executor.kv_caches
    assert len(caches) == config.num_hidden_layers
    for cache in caches:
        assert cache.key.shape == (1, 16, 4, config.kv_lora_rank + config.qk_rope_head_dim)
        assert cache.value.shape == (1, 16, 4, config.kv_lora_rank)
        assert cache.value.data_ptr() == cache.key.data_ptr()  # no second copy of the latent
    allocated = sum(cache.key.numel() * cache.key.element_size() for cache in caches)
    per_token = kv_bytes_per_token(mla_kv_layout(config), caches[0].key.element_size())
    assert allocated == per_token * 16 * 4
    assert per_token == config.num_hidden_layers * (32 + 8) * 4  # tiny model: rank 32, rope 8, fp32
    mha = kv_bytes_per_token(mha_kv_layout(config), 4)
    assert mha == config.num_hidden_layers * 4 * (16 + 8 + 12) * 4  # 4 heads of K (24) and V (12)
    engine.shutdown()


def test_copy_and_swap_move_whole_latent_blocks(tiny_mla):
    engine = make_engine(tiny_mla["v2"][0], preemption_mode="swap", num_swap_blocks=8, max_num_blocks=16)
    executor = engine.executor
    key = executor.kv_caches[1].key
    key.copy_(torch.randn_like(key))
    original = key[:, 3].clone()
    executor.copy_blocks([(3, 9)])
    assert torch.equal(key[:, 9], original)
    executor.swap_out([(9, 2)])
    key[:, 9].zero_()
    executor.swap_in([(2, 11)])
    assert torch.equal(key[:, 11], original)
    assert torch.equal(
        executor.kv_caches[1].value[:, 11], original[..., : executor.model.config.kv_lora_rank]
    )
    engine.shutdown()


class TestDeepseekV2Architecture(ArchitectureContract):
    """Core's architecture kit on DeepSeek-V2: no q compression, layer 1 routed (group-limited) +
    shared experts."""

    def make_hf_model(self):
        return build_tiny_mla_model(
            "deepseek_v2",
            first_k_dense_replace=1,
            topk_method="group_limited_greedy",
            n_group=2,
            topk_group=1,
        )


class TestDeepseekV3Architecture(ArchitectureContract):
    """DeepSeek-V3: q compression, YaRN RoPE, layer 1 sigmoid-routed (noaux_tc) experts. (HF's own
    KV-cached generate was seen to flip a router near-tie at token 3 of one prompt here; the kit's
    reference, HF's plain forward recomputed per token, does not depend on that.)"""

    def make_hf_model(self):
        return build_tiny_mla_model("deepseek_v3", first_k_dense_replace=1, rope_parameters=YARN)


def test_bf16_with_packed_linears_and_experts_tracks_hf(tiny_mla):
    """bf16 on the CPU runtime: linears and routed experts packed for the compiled kernels (where
    they build), gate/up through the kernels' SiLU-and-multiply; the prefill's logits follow HF's
    fp32 ones (each row's cosine similarity above 0.995)."""
    from hetero_core.default_plugins.torch_executor import TorchExecutor
    from hetero_core.default_plugins.torch_options import TorchExecutorOptions
    from hetero_core.executor import ExecutorContext
    from hetero_core.testing.paged import BlockPool, ContractSequence, build_batch

    model_dir, hf_model = tiny_mla["v2_moe"]
    ctx = ExecutorContext(
        settings=None,
        options=TorchExecutorOptions(dtype="bfloat16"),
        model_dir=model_dir,
        num_blocks=32,
        block_size=4,
        max_model_len=128,
        max_num_batched_tokens=128,
        max_num_seqs=4,
        eos_token_id=None,
        vocab_size=0,
    )
    executor = TorchExecutor(ctx)
    assert executor.dtype == torch.bfloat16
    tokens = PROMPTS[2]
    seq = ContractSequence(0, tokens, len(tokens))
    batch = build_batch([(seq, len(tokens))], BlockPool(32, shuffle=True), 4)
    batch = type(batch)(**{**batch.__dict__, "prompt_logits": [True]})
    got = executor.execute(batch).prompt_logits[0].float()
    with torch.no_grad():
        expected = hf_model(torch.tensor([tokens])).logits[0]
    assert torch.nn.functional.cosine_similarity(got, expected, dim=-1).min() > 0.995
    executor.shutdown()
