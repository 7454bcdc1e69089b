"""Tiny randomly initialised HF models (built from a transformers config, never downloaded)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

VOCAB = 96
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    eos_token_id=1,
    bos_token_id=0,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}

# name -> (config class name, extra config fields)
TINY_MODELS = {
    "llama": ("LlamaConfig", {}),
    "llama3_rope": ("LlamaConfig", {"rope_parameters": LLAMA3_ROPE}),
    "llama31_rope": (
        "LlamaConfig",
        {
            "rope_parameters": {**LLAMA3_ROPE, "original_max_position_embeddings": 8192},
            "max_position_embeddings": 16384,
        },
    ),
    "llama_mqa_tied": ("LlamaConfig", {"num_key_value_heads": 1, "tie_word_embeddings": True}),
    "llama_bias": ("LlamaConfig", {"attention_bias": True, "mlp_bias": True}),
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": False}),
    "qwen3": ("Qwen3Config", {"head_dim": 32, "tie_word_embeddings": False}),
    # heads of 32 dims: decode steps take the fused path (fused_decode), with biases in every linear
    "llama_wide_heads": (
        "LlamaConfig",
        {"num_attention_heads": 2, "num_key_value_heads": 1, "attention_bias": True, "mlp_bias": True},
    ),
    "qwen2_wide_heads": (
        "Qwen2Config",
        {"num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": False},
    ),
    # heads, KV heads, MLP and vocabulary all divide by 3: tensor parallelism over three ranks
    "llama_three_ranks": (
        "LlamaConfig",
        {"hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 3},
    ),
}


# A Llama whose linear weights are what a Q4_1 checkpoint dequantizes to (exact block codes): in fp32
# the CPU kernels stream them as codes (coded_linear), as they do the embedded SmolLM2's.
BLOCK_CODE_MODELS = {"llama_q4_1": "llama"}


def build_tiny_hf_model(name: str, seed: int = 0):
    """A randomly initialised HF model with weights large enough to make mistakes visible."""
    if name in BLOCK_CODE_MODELS:
        return _q4_1_linears(build_tiny_hf_model(BLOCK_CODE_MODELS[name], seed))
    class_name, extra = TINY_MODELS[name]
    config = getattr(transformers, class_name)(**{**_COMMON, **extra})
    return random_hf_model(config, seed)


def random_hf_model(config, seed: int = 0):
    """The HF model of ``config`` in fp32, its weights drawn with ``seed`` large enough to make mistakes
    visible (norm weights in [0.5, 1.5], the rest N(0, 0.15))."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "norm" in param_name:
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.15)
    return model.eval()


def _q4_1_linears(model):
    """Every linear weight rounded to Q4_1's grid: per block of 32 inputs, f16 ``m`` (the minimum) and
    ``d`` ((max - min) / 15), the weight ``d * q + m`` with q in 0..15."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                weight = module.weight.reshape(module.weight.shape[0], -1, 32)
                m = weight.amin(dim=-1, keepdim=True).half().float()
                d = ((weight.amax(dim=-1, keepdim=True) - m) / 15).half().float()
                q = torch.round((weight - m) / d).clamp_(0, 15)
                module.weight.copy_((d * q + m).reshape(module.weight.shape))
    return model


def save_tiny_model(name: str, directory: Path, **save_kwargs):
    model = build_tiny_hf_model(name)
    model.save_pretrained(directory, safe_serialization=True, **save_kwargs)
    return model


def hf_logits(hf_model, token_ids: list[int]):
    """Logits of the HF implementation for every position of ``token_ids``: [len, vocab]."""
    with torch.no_grad():
        return hf_model(torch.tensor([token_ids])).logits[0]
