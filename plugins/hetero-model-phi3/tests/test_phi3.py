"""Phi-3 against transformers' own Phi3ForCausalLM (tiny random weights, nothing downloaded): the
architecture kit (logits, greedy through the engine with chunked prefill and preemption, the
executor contract) for plain RoPE, and for partial rotary with LongRoPE; the config adapter's
refusals and limits."""

from __future__ import annotations

import pytest
import torch
import transformers

import hetero_model_phi3
from hetero_core import ModelLoadError
from hetero_core.testing import ArchitectureContract
from hetero_model_phi3 import phi3_config

TINY = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=0,
    tie_word_embeddings=False,
)
RAW = {
    "architectures": ["Phi3ForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 96,
    "vocab_size": 96,
    "max_position_embeddings": 512,
}


def randomized(model):
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.uniform_(0.5, 1.5) if "norm" in name else param.normal_(0.0, 0.15)
    return model


class TestPhi3(ArchitectureContract):
    plugin = hetero_model_phi3

    def make_hf_model(self):
        return randomized(
            transformers.AutoModelForCausalLM.from_config(
                transformers.Phi3Config(**TINY), dtype=torch.float32
            )
        )


class TestPhi3PartialRotaryLongRope(TestPhi3):
    """Phi-4-mini's shape: half the channels rotated, LongRoPE short factors and attention factor."""

    def make_hf_model(self):
        rope = {
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "short_factor": [1.0, 1.5, 2.0, 3.0],
            "long_factor": [4.0, 5.0, 6.0, 8.0],
            "original_max_position_embeddings": 256,
        }
        config = transformers.Phi3Config(**TINY, rope_parameters=rope, original_max_position_embeddings=256)
        return randomized(transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32))


def test_longrope_and_sliding_window_cap_the_context_where_the_results_stay_exact():
    longrope = {
        "rope_scaling": {"type": "su", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
        "original_max_position_embeddings": 128,
    }
    config = phi3_config({**RAW, **longrope})
    assert config.max_position_embeddings == 128 and config.rotary_dim == 16
    assert config.rope_attention_factor == pytest.approx(
        (1 + torch.log(torch.tensor(4.0)).item() / 4.852030) ** 0.5, rel=1e-4
    )
    assert phi3_config({**RAW, "sliding_window": 100}).max_position_embeddings == 100


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
            "Phi-3 rope_type 'dynamic' is not supported; supported: default, longrope",
        ),
        (
            {"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8}},
            "longrope needs short_factor and original_max_position_embeddings",
        ),
        (
            {
                "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 3},
                "original_max_position_embeddings": 64,
            },
            "short_factor has 3 entries; 8",
        ),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ({"partial_rotary_factor": 0.2}, "partial_rotary_factor gives 3 rotated channels"),
    ],
)
def test_configs_it_cannot_run_are_refused_by_name(change, message):
    with pytest.raises(ModelLoadError, match=message):
        phi3_config({**RAW, **change})
