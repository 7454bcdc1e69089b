"""Qwen3-MoE, Qwen2-MoE and Mixtral as core's built-in architectures, registered by core's default
plugin through ``register_model_architectures`` beside the Llama family. Imports no torch."""

from __future__ import annotations

from typing import Any

from hetero_core.model.moe.config import MOE_ARCHITECTURES, MoeModelConfig, moe_model_config
from hetero_core.plugin_system.architectures import ModelArchitecture, WeightMapping, same_kv_layout


def build_moe(config: MoeModelConfig, backend):
    from hetero_core.model.moe.model import MoeForCausalLM

    return MoeForCausalLM(config, backend)


# per-expert checkpoint tensors stacked per layer, Mixtral's names mapped (``weights``)
STACKED_EXPERTS = WeightMapping.from_module("hetero_core.model.moe.weights")


def bench_config(architecture: str) -> dict[str, Any]:
    """~150M parameters of which ~60M active per token (8 experts of 512, top 2), for
    ``hetero bench models``."""
    raw = {
        "architectures": [architecture],
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "num_experts_per_tok": 2,
    }
    if architecture == "MixtralForCausalLM":
        return {
            **raw,
            "model_type": "mixtral",
            "intermediate_size": 512,
            "num_local_experts": 8,
            "sliding_window": None,
        }
    raw = {
        **raw,
        "intermediate_size": 1024,
        "num_experts": 8,
        "moe_intermediate_size": 512,
        "norm_topk_prob": True,
    }
    if architecture == "Qwen2MoeForCausalLM":
        return {
            **raw,
            "model_type": "qwen2_moe",
            "shared_expert_intermediate_size": 512,
            "norm_topk_prob": False,
        }
    return {**raw, "model_type": "qwen3_moe", "head_dim": 64}


def moe_architectures() -> dict[str, ModelArchitecture]:
    """Core's MoE built-ins, by HF architecture name. ``tensor_parallel``: attention and dense layers
    shard the Llama way; each expert's columns are split across the ranks (``sharded_experts``), or
    with ``enable_expert_parallel`` whole experts are (``expert_parallel``)."""
    return {
        name: ModelArchitecture(
            config=moe_model_config,
            build=build_moe,
            kv_layout=same_kv_layout,
            weights=STACKED_EXPERTS,
            tensor_parallel=True,
            bench_config=lambda name=name: bench_config(name),
            hf_class=name,
        )
        for name in MOE_ARCHITECTURES
    }
