"""DeepSeek-V2 and DeepSeek-V3 (multi-head latent attention) as core built-in architectures,
registered by core's default plugin through ``register_model_architectures``. Imports no torch.

The KV layout is MLA's: per layer and token one latent vector and the RoPE key
(``kv_lora_rank + qk_rope_head_dim`` values, one "head"), the value being the latent's first
``kv_lora_rank`` channels (``value_in_key``), never stored again.
"""

from __future__ import annotations

from typing import Any

from hetero_core.model.mla.config import MLA_ARCHITECTURES, MLAConfig
from hetero_core.plugin_system.architectures import (
    KVLayerSpec,
    ModelArchitecture,
    WeightMapping,
    unused_buffers,
)


def mla_config(raw: dict[str, Any], source: str = "config") -> MLAConfig:
    return MLAConfig.from_dict(raw, source)


def build_mla(config: MLAConfig, backend):
    from hetero_core.model.mla.model import DeepseekForCausalLM

    return DeepseekForCausalLM(config, backend)


def mla_kv_layout(config: MLAConfig) -> tuple[KVLayerSpec, ...]:
    spec = KVLayerSpec(
        num_kv_heads=1, key_dim=config.latent_dim, value_dim=config.kv_lora_rank, value_in_key=True
    )
    return (spec,) * config.num_hidden_layers


def mha_kv_layout(config: MLAConfig) -> tuple[KVLayerSpec, ...]:
    """The layout the same model would need with plain multi-head attention (per-head K and V), for
    comparison (``hetero bench models``, docs/models.md)."""
    spec = KVLayerSpec(config.num_attention_heads, config.qk_head_dim, config.v_head_dim)
    return (spec,) * config.num_hidden_layers


def ignored(name: str, config: MLAConfig) -> bool:
    """DeepSeek-V3's multi-token-prediction layers (``model.layers.<num_hidden_layers + i>.*`` for the
    ``num_nextn_predict_layers`` of config.json): inference without MTP does not run them, as
    transformers and vLLM without speculative decoding skip them; and ``unused_buffers``."""
    if name.startswith("model.layers."):
        index = name.split(".")[2]
        if index.isdigit() and 0 <= int(index) - config.num_hidden_layers < config.num_nextn_predict_layers:
            return True
    return unused_buffers(name, config)


# routed experts stacked per layer (``mla.weights``); every other name as it is; MTP layers skipped
STACKED_EXPERTS = WeightMapping.from_module("hetero_core.model.mla.weights", ignored=ignored)


def bench_config(architecture: str) -> dict[str, Any]:
    """~150M parameters, the Llama built-ins' bench shape (hidden 768, 12 layers of 12 heads, dense
    MLPs of 2048) with DeepSeek-V2-Lite's MLA proportions (latent = hidden / 4, no q compression)."""
    return {
        "architectures": [architecture],
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 2048,
        "vocab_size": 32000,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "kv_lora_rank": 192,
        "q_lora_rank": None,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 32,
        "v_head_dim": 64,
        "first_k_dense_replace": 12,
        "n_routed_experts": None,
        "model_type": "deepseek_v2" if architecture == "DeepseekV2ForCausalLM" else "deepseek_v3",
    }


def mla_architectures() -> dict[str, ModelArchitecture]:
    """Core's MLA built-ins, by HF architecture name."""
    return {
        name: ModelArchitecture(
            config=mla_config,
            build=build_mla,
            kv_layout=mla_kv_layout,
            weights=STACKED_EXPERTS,
            bench_config=lambda name=name: bench_config(name),
            hf_class=name,
        )
        for name in MLA_ARCHITECTURES
    }
