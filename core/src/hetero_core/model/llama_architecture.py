"""The Llama family (Llama, Qwen2, Qwen3) as core's built-in architectures, registered by core's
default plugin through ``register_model_architectures`` like any plugin's. Imports no torch."""

from __future__ import annotations

from typing import Any

from hetero_core.errors import ModelLoadError
from hetero_core.model.config import LLAMA_FAMILY, ModelConfig, parse_config
from hetero_core.plugin_system.architectures import ModelArchitecture, WeightMapping, same_kv_layout

HF_CLASSES = {
    "LlamaForCausalLM": "LlamaForCausalLM",
    "Qwen2ForCausalLM": "Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "Qwen3ForCausalLM",
}


def llama_config(raw: dict[str, Any], source: str = "config") -> ModelConfig:
    """A Llama-family ``config.json``; sliding windows and activations other than SiLU are refused."""
    if raw.get("use_sliding_window") or "sliding_attention" in (raw.get("layer_types") or []):
        raise ModelLoadError(
            f"{source}: sliding-window attention is not supported; set use_sliding_window=false"
        )
    if raw.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ModelLoadError(f"{source}: hidden_act {raw['hidden_act']!r} is not supported; supported: silu")
    return parse_config(
        raw, source, qk_norm=LLAMA_FAMILY.get((raw.get("architectures") or [""])[0]) == "qwen3"
    )


def build_llama(config: ModelConfig, backend):
    from hetero_core.model.llama import LlamaForCausalLM

    return LlamaForCausalLM(config, backend)


# q/k/v fused into qkv_proj and gate/up into gate_up_proj (``fusion``).
FUSED_PROJECTIONS = WeightMapping.from_module(
    "hetero_core.model.fusion", from_checkpoint="fuse_checkpoint", to_checkpoint="split_state"
)


def bench_config(architecture: str) -> dict[str, Any]:
    """~150M parameters (a SmolLM2-like shape), for ``hetero bench models``."""
    raw = {
        "architectures": [architecture],
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "intermediate_size": 2048,
        "vocab_size": 32000,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "model_type": LLAMA_FAMILY[architecture],
    }
    if architecture == "Qwen3ForCausalLM":
        raw["head_dim"] = 64
    return raw


def llama_architectures() -> dict[str, ModelArchitecture]:
    """Core's built-ins, by HF architecture name."""
    return {
        name: ModelArchitecture(
            config=llama_config,
            build=build_llama,
            kv_layout=same_kv_layout,
            weights=FUSED_PROJECTIONS,
            tensor_parallel=True,
            pipeline_parallel=True,
            bench_config=lambda name=name: bench_config(name),
            hf_class=HF_CLASSES[name],
        )
        for name in LLAMA_FAMILY
    }
