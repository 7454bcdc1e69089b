"""Tiny randomly initialised DeepSeek-V2/V3 models (built from a transformers config, never
downloaded), every layer dense unless a test asks for experts."""

from __future__ import annotations

from pathlib import Path

import transformers

from tests.model.tiny_models import random_hf_model

VOCAB = 96
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    eos_token_id=1,
    bos_token_id=0,
    kv_lora_rank=32,  # the cache holds 32 + 8 = 40 values per token per layer
    q_lora_rank=None,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=12,
    first_k_dense_replace=2,  # every layer dense
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    n_shared_experts=1,
)
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
    "beta_fast": 32,
    "beta_slow": 1,
}

# name -> (config class name, extra config fields)
TINY_MLA_MODELS = {
    "deepseek_v2": ("DeepseekV2Config", {}),
    "deepseek_v2_q_lora": ("DeepseekV2Config", {"q_lora_rank": 24}),
    "deepseek_v2_biases": ("DeepseekV2Config", {"attention_bias": True}),  # q_proj and kv_a_proj stay apart
    "deepseek_v2_q_lora_biases": ("DeepseekV2Config", {"q_lora_rank": 24, "attention_bias": True}),
    "deepseek_v2_yarn": ("DeepseekV2Config", {"q_lora_rank": 24, "rope_parameters": YARN}),
    "deepseek_v3": ("DeepseekV3Config", {"q_lora_rank": 24, "n_group": 2, "topk_group": 1}),
    "deepseek_v3_rotate_half": (
        "DeepseekV3Config",
        {"rope_interleave": False, "n_group": 2, "topk_group": 1},
    ),
}


def build_tiny_mla_model(name: str, seed: int = 0, **overrides):
    class_name, extra = TINY_MLA_MODELS[name]
    config = getattr(transformers, class_name)(**{**_COMMON, **extra, **overrides})
    return random_hf_model(config, seed)


def save_tiny_mla_model(name: str, directory: Path, **overrides):
    model = build_tiny_mla_model(name, **overrides)
    model.save_pretrained(directory, safe_serialization=True)
    return model
