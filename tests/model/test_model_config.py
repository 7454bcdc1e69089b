"""ModelConfig parsing: both RoPE spellings, derived fields, and errors that name the fix."""

from __future__ import annotations

import json

import pytest

from hetero_core.errors import ModelLoadError
from hetero_core.model.config import ModelConfig

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 100,
}


def test_defaults_and_derived_fields():
    config = ModelConfig.from_dict({**BASE, "eos_token_id": [5, 7]})
    assert config.head_dim == 16
    assert config.num_key_value_heads == 4
    assert config.rope_theta == 10000.0 and config.rope_scaling is None
    assert config.eos_token_ids == (5, 7) and config.eos_token_id == 5
    assert not config.qkv_bias and not config.qk_norm and config.variant == "llama"


def test_transformers4_and_transformers5_rope_spellings_agree():
    legacy = ModelConfig.from_dict(
        {
            **BASE,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        }
    )
    current = ModelConfig.from_dict(
        {
            **BASE,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        }
    )
    assert legacy.rope_theta == current.rope_theta == 500000.0
    assert legacy.rope_scaling["rope_type"] == current.rope_scaling["rope_type"] == "llama3"
    assert legacy.rope_scaling["factor"] == current.rope_scaling["factor"]
    plain = ModelConfig.from_dict({**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert plain.rope_scaling is None and plain.rope_theta == 1e6


def test_qwen_variants():
    qwen2 = ModelConfig.from_dict({**BASE, "architectures": ["Qwen2ForCausalLM"]})
    assert qwen2.qkv_bias and not qwen2.o_proj_bias and not qwen2.qk_norm
    qwen3 = ModelConfig.from_dict({**BASE, "architectures": ["Qwen3ForCausalLM"], "head_dim": 32})
    assert qwen3.qk_norm and qwen3.head_dim == 32 and not qwen3.qkv_bias


def test_unsupported_architecture_lists_supported_ones():
    from hetero_core.plugin_system.discovery import load_plugins
    from hetero_core.plugin_system.installed import install_architectures

    install_architectures(load_plugins(entry_points=[]).registry.architectures)  # core's alone
    try:
        with pytest.raises(ModelLoadError) as info:
            ModelConfig.from_dict({**BASE, "architectures": ["GPT2LMHeadModel"]})
    finally:
        install_architectures(None)
    assert str(info.value) == (
        "unsupported architecture 'GPT2LMHeadModel'; supported: DeepseekV2ForCausalLM, "
        "DeepseekV3ForCausalLM, "
        "LlamaForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, Qwen2MoeForCausalLM, Qwen3ForCausalLM, "
        "Qwen3MoeForCausalLM"
        " (registered by plugins: core; a plugin adds one through register_model_architectures, "
        "see docs/models.md)"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "unsupported rope_scaling type 'yarn'"),
        ({"rope_scaling": {"type": "llama3", "factor": 8.0}}, "missing low_freq_factor"),
        ({"use_sliding_window": True}, "sliding-window attention is not supported"),
        ({"hidden_size": None}, "missing required field 'hidden_size'"),
        ({"vocab_size": "lots"}, "invalid field value"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ],
)
def test_unsupported_or_broken_configs(change, message):
    raw = {**BASE, **change}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(ModelLoadError, match=message):
        ModelConfig.from_dict(raw)


def test_from_dir_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        ModelConfig.from_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="cannot read"):
        ModelConfig.from_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    assert ModelConfig.from_dir(tmp_path).hidden_size == 64
