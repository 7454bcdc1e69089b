"""Write a tiny HF model as an F32 GGUF the way llama.cpp's converter does (names from gguf-py's
own tensor map, q/k permuted for ``llama``), so GGUF loading is tested without the big file."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np

GGUF_ARCH = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3}


def llama_cpp_permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (for q with n_head, for k with n_head_kv)."""
    return (
        weights.reshape(num_heads, 2, weights.shape[0] // num_heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def llama_cpp_rope_factors(rope: dict, head_dim: int) -> np.ndarray:
    """convert_hf_to_gguf.py's ``rope_freqs`` for Llama 3 scaling (divisors of each frequency)."""
    freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_context_len = rope["original_max_position_embeddings"]
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_context_len / high:
            factors.append(1.0)
        elif wavelen > old_context_len / low:
            factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def write_tiny_gguf(hf_model, path: Path, add_metadata=None) -> None:
    """``add_metadata(writer)``, when given, adds the tokenizer (a real vocabulary's fields: its EOS
    among them) in place of the bare EOS id."""
    config = hf_model.config
    arch_name = config.model_type
    name_map = gguf.get_tensor_name_map(GGUF_ARCH[arch_name], config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch_name)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    if add_metadata is None:
        writer.add_eos_token_id(config.eos_token_id)
    else:
        add_metadata(writer)
    if config.rope_parameters.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama_cpp_rope_factors(config.rope_parameters, head_dim))
    for hf_name, tensor in hf_model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        base, suffix = hf_name.rsplit(".", 1)
        data = tensor.detach().float().numpy().copy()
        if arch_name == "llama" and base.endswith("q_proj"):
            data = llama_cpp_permute(data, config.num_attention_heads)
        elif arch_name == "llama" and base.endswith("k_proj"):
            data = llama_cpp_permute(data, config.num_key_value_heads)
        writer.add_tensor(f"{name_map.get_name(base)}.{suffix}", data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
