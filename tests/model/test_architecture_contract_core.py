"""Core's built-in architectures pass the architecture kit (``hetero_core.testing.ArchitectureContract``)
against HF transformers: logits, greedy tokens through the engine with chunked prefill and
preemption, and the executor contract."""

from __future__ import annotations

import torch
import transformers

from hetero_core.testing import ArchitectureContract

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
)


def randomized(model):
    """Weights large enough that a mistake shows (the same recipe as tests/model/tiny_models.py)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.uniform_(0.5, 1.5) if "norm" in name else param.normal_(0.0, 0.15)
    return model


class TestQwen3Architecture(ArchitectureContract):
    def make_hf_model(self):
        config = transformers.Qwen3Config(**TINY, head_dim=32, tie_word_embeddings=False)
        return randomized(transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32))
