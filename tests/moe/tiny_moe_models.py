"""Tiny randomly initialised HF mixture-of-experts models (built from a transformers config, never
downloaded): Qwen3-MoE with a dense layer among sparse ones, Qwen2-MoE with its shared expert,
Mixtral."""

from __future__ import annotations

import transformers

from tests.model.tiny_models import random_hf_model

VOCAB = 96
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    eos_token_id=1,
    bos_token_id=0,
    tie_word_embeddings=False,
)

# name -> (config class name, extra config fields)
TINY_MOE_MODELS = {
    # layer 1 of 3 is dense (mlp_only_layers); renormalised top-2 of 8 experts
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {
            "num_hidden_layers": 3,
            "head_dim": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
            "mlp_only_layers": [1],
        },
    ),
    # a shared expert beside 8 routed ones, top-2 not renormalised
    "qwen2_moe": (
        "Qwen2MoeConfig",
        {
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48,
            "norm_topk_prob": False,
        },
    ),
    "mixtral": ("MixtralConfig", {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 32}),
}
HF_ARCHITECTURES = {
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
}


def build_tiny_moe_model(name: str, seed: int = 0, **overrides):
    """A randomly initialised HF MoE model with weights large enough to make mistakes visible."""
    class_name, extra = TINY_MOE_MODELS[name]
    config = getattr(transformers, class_name)(**{**_COMMON, **extra, **overrides})
    return random_hf_model(config, seed)


def save_tiny_moe_model(name: str, directory, **overrides):
    model = build_tiny_moe_model(name, **overrides)
    model.save_pretrained(directory, safe_serialization=True)
    return model
