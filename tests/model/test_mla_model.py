"""MLA (DeepSeek-V2/V3) model code against Hugging Face transformers on tiny random models: the
logits of every position through the paged latent cache, under chunked prefill, mixed prefill and
decode batches (decodes run the absorbed form) and shuffled block tables."""

from __future__ import annotations

import tempfile

import pytest
import torch

from hetero_core.errors import ModelLoadError
from hetero_core.model.attention import KVCache
from hetero_core.model.cpu.torch_attention import TorchPagedAttention
from hetero_core.model.loader import load_model
from hetero_core.model.mla.config import MLAConfig
from hetero_core.model.mla.model import DeepseekForCausalLM
from tests.model.paged_batches import BlockPool, PagedSequence, step
from tests.model.tiny_mla_models import TINY_MLA_MODELS, VOCAB, build_tiny_mla_model

BLOCK_SIZE = 4


def raw_config(hf_model) -> dict:
    """The model's config.json as a saved checkpoint has it (with ``architectures``)."""
    return {**hf_model.config.to_dict(), "architectures": [type(hf_model).__name__]}


def load(hf_model) -> DeepseekForCausalLM:
    """The model as the loader builds it from the saved checkpoint (per-expert tensors stacked, gate
    and up fused by the architecture's weight mapping)."""
    with tempfile.TemporaryDirectory() as directory:
        hf_model.save_pretrained(directory, safe_serialization=True)
        model = load_model(directory, backend=TorchPagedAttention())
    assert isinstance(model, DeepseekForCausalLM)
    return model


def latent_caches(config: MLAConfig, num_blocks: int = 64) -> list[KVCache]:
    return [
        KVCache(
            torch.zeros(1, num_blocks, BLOCK_SIZE, config.latent_dim),
            torch.zeros(1, num_blocks, BLOCK_SIZE, 0),
        )
        for _ in range(config.num_hidden_layers)
    ]


def run(model, caches, batch) -> torch.Tensor:
    """Logits of every row of ``batch``."""
    with torch.inference_mode():
        metadata = model.backend.build_metadata(batch, torch.device("cpu"))
        hidden = model(torch.tensor(batch.token_ids), torch.tensor(batch.positions), metadata, caches)
        return model.compute_logits(hidden)


def hf_logits(hf_model, tokens) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([tokens])).logits[0]


@pytest.mark.parametrize("name", list(TINY_MLA_MODELS))
def test_one_prefill_matches_hf_at_every_position(name):
    hf_model = build_tiny_mla_model(name)
    model = load(hf_model)
    tokens = torch.randint(0, VOCAB, (45,), generator=torch.Generator().manual_seed(1)).tolist()
    seq = PagedSequence(0, tokens, len(tokens))
    got = run(
        model,
        latent_caches(model.config),
        step([(seq, len(tokens))], BlockPool(64, shuffle=True), BLOCK_SIZE),
    )
    torch.testing.assert_close(got, hf_logits(hf_model, tokens), atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["deepseek_v2", "deepseek_v2_yarn", "deepseek_v3"])
def test_chunked_prefill_and_absorbed_decodes_in_mixed_batches_match_hf(name):
    """Two sequences: one prefilled in chunks (continuing its cached latent) while the other decodes;
    every sampled row equals HF's logits at that position."""
    hf_model = build_tiny_mla_model(name)
    model = load(hf_model)
    generator = torch.Generator().manual_seed(2)
    a_tokens = torch.randint(0, VOCAB, (30,), generator=generator).tolist()
    b_tokens = torch.randint(0, VOCAB, (40,), generator=generator).tolist()
    a, b = PagedSequence(0, a_tokens, 10), PagedSequence(1, b_tokens, 23)
    pool, caches = BlockPool(64, shuffle=True), latent_caches(model.config)
    schedule = [[(a, 10)], [(a, 1), (b, 7)], [(a, 1), (b, 9)], [(b, 7), (a, 1)]] + [[(a, 1), (b, 1)]] * 12
    expected_a, expected_b = hf_logits(hf_model, a_tokens), hf_logits(hf_model, b_tokens)
    for segments in schedule:
        batch = step(segments, pool, BLOCK_SIZE)
        logits = run(model, caches, batch)
        for (seq, _), end in zip(segments, batch.query_start_loc[1:]):
            expected = expected_a if seq is a else expected_b
            if seq.num_computed >= seq.num_prompt_tokens:  # a sampled row: the segment's last token
                torch.testing.assert_close(
                    logits[end - 1], expected[seq.num_computed - 1], atol=2e-4, rtol=1e-4
                )


def test_a_decode_attends_only_its_own_context():
    """Pure decode steps over sequences of different lengths (key masks past each context)."""
    hf_model = build_tiny_mla_model("deepseek_v2_q_lora")
    model = load(hf_model)
    generator = torch.Generator().manual_seed(3)
    seqs = [
        PagedSequence(i, torch.randint(0, VOCAB, (n + 6,), generator=generator).tolist(), n)
        for i, n in enumerate([3, 17, 9])
    ]
    pool, caches = BlockPool(64, shuffle=True), latent_caches(model.config)
    run(model, caches, step([(s, s.num_prompt_tokens) for s in seqs], pool, BLOCK_SIZE))
    for _ in range(6):
        logits = run(model, caches, step([(s, 1) for s in seqs], pool, BLOCK_SIZE))
        for row, s in enumerate(seqs):
            torch.testing.assert_close(
                logits[row], hf_logits(hf_model, s.token_ids[: s.num_computed])[-1], atol=2e-4, rtol=1e-4
            )


MOE_VARIANTS = {
    "v2 greedy": ("deepseek_v2", dict(topk_method="greedy", routed_scaling_factor=1.5)),
    "v2 group-limited": (
        "deepseek_v2_q_lora",
        dict(topk_method="group_limited_greedy", n_group=2, topk_group=1, n_shared_experts=2),
    ),
    "v3 noaux_tc": ("deepseek_v3", dict(routed_scaling_factor=2.5)),
}


@pytest.mark.parametrize("variant", list(MOE_VARIANTS))
def test_moe_layers_match_hf(variant):
    """Layer 0 dense, layer 1 routed + shared experts: every position of a prefill, then decodes."""
    name, overrides = MOE_VARIANTS[variant]
    hf_model = build_tiny_mla_model(name, first_k_dense_replace=1, **overrides)
    if name == "deepseek_v3":  # a correction bias that changes which experts win
        with torch.no_grad():
            hf_model.model.layers[1].mlp.gate.e_score_correction_bias.normal_(0.0, 0.3)
    model = load(hf_model)
    tokens = torch.randint(0, VOCAB, (36,), generator=torch.Generator().manual_seed(4)).tolist()
    seq, pool, caches = PagedSequence(0, tokens, 30), BlockPool(64, shuffle=True), latent_caches(model.config)
    expected = hf_logits(hf_model, tokens)
    torch.testing.assert_close(
        run(model, caches, step([(seq, 30)], pool, BLOCK_SIZE)), expected[:30], atol=2e-4, rtol=1e-4
    )
    for position in range(30, 36):
        torch.testing.assert_close(
            run(model, caches, step([(seq, 1)], pool, BLOCK_SIZE))[0],
            expected[position],
            atol=2e-4,
            rtol=1e-4,
        )


def test_stacked_experts_and_fused_gate_up_map_to_and_from_checkpoint_names():
    from hetero_core.model.mla.weights import checkpoint_names, from_checkpoint, to_checkpoint

    model = load(build_tiny_mla_model("deepseek_v2", first_k_dense_replace=1))
    state = model.state_dict()
    checkpoint = to_checkpoint(state, model.config)
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in checkpoint
    assert "model.layers.1.mlp.experts.gate_up_proj" not in checkpoint
    assert {"model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.shared_experts.up_proj.weight"} <= set(
        checkpoint
    )
    assert "model.layers.0.mlp.gate_up_proj.weight" not in checkpoint
    assert sorted(checkpoint_names(state, model.config)) == sorted(checkpoint)
    back = from_checkpoint(checkpoint, state, model.config)
    assert all(torch.equal(back[name], state[name]) for name in state)


def test_an_unknown_topk_method_is_refused_by_name():
    raw = raw_config(build_tiny_mla_model("deepseek_v2", first_k_dense_replace=1, topk_method="greedy"))
    with pytest.raises(ModelLoadError, match="topk_method 'sometimes' is not supported; supported: greedy"):
        with torch.device("meta"):
            DeepseekForCausalLM(
                MLAConfig.from_dict({**raw, "topk_method": "sometimes"}), TorchPagedAttention()
            )


def test_a_rope_type_mla_does_not_run_is_refused():
    raw = {
        **raw_config(build_tiny_mla_model("deepseek_v2")),
        "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0},
    }
    with pytest.raises(
        ModelLoadError, match="rope type 'longrope' is not supported for MLA; supported: default, yarn"
    ):
        MLAConfig.from_dict(raw)


def test_a_backend_without_a_latent_path_is_refused():
    raw = raw_config(build_tiny_mla_model("deepseek_v2"))

    class MhaOnly:
        name = "mha_only"

    with pytest.raises(ModelLoadError, match="'mha_only' has no latent-attention path"):
        DeepseekForCausalLM(MLAConfig.from_dict(raw), MhaOnly())


def test_kv_bytes_per_token_of_deepseek_v2_against_plain_mha():
    """DeepSeek-V2's shape: 60 layers of 128 heads, latent 512 + RoPE key 64, bf16."""
    from hetero_core.architectures import kv_bytes_per_token
    from hetero_core.model.mla.architecture import mha_kv_layout, mla_kv_layout

    raw = {
        "architectures": ["DeepseekV2ForCausalLM"],
        "hidden_size": 5120,
        "num_hidden_layers": 60,
        "num_attention_heads": 128,
        "intermediate_size": 12288,
        "vocab_size": 102400,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
    }
    config = MLAConfig.from_dict(raw)
    assert kv_bytes_per_token(mla_kv_layout(config), 2) == 60 * (512 + 64) * 2  # 69,120
    assert kv_bytes_per_token(mha_kv_layout(config), 2) == 60 * 128 * ((128 + 64) + 128) * 2  # 4,915,200


def test_the_bench_config_builds_for_its_weights_alone():
    """``hetero bench models`` builds each architecture's bench config on the meta device, no backend."""
    from hetero_core.model.mla.architecture import bench_config, build_mla, mla_config

    for name in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"):
        with torch.device("meta"):
            model = build_mla(mla_config(bench_config(name)), None)
        assert 100e6 < sum(p.numel() for p in model.parameters()) < 200e6


def test_moe_layers_without_their_sizes_are_refused_by_name():
    raw = raw_config(build_tiny_mla_model("deepseek_v2", first_k_dense_replace=1))
    with pytest.raises(ModelLoadError, match="mixtures of experts .* but moe_intermediate_size is not set"):
        MLAConfig.from_dict({**raw, "moe_intermediate_size": None})
