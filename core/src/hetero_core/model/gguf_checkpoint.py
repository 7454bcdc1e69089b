"""Read a llama.cpp GGUF file: an HF-style config dict and fp32 weights under HF names.

Weights are dequantized with the ``gguf`` package. llama.cpp stores the q/k projections of
``llama`` models permuted for its interleaved RoPE; we undo that so the HF (rotate-half) model code
applies. Qwen2/Qwen3 are stored unpermuted.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hetero_core.errors import ModelLoadError

# GGUF general.architecture -> HF architecture name.
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

# llama.cpp tensor names -> HF names. "{i}" is the layer index.
GLOBAL_TENSOR_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
LAYER_TENSOR_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
IGNORED_TENSORS = {"rope_freqs"}  # llama.cpp's precomputed llama3 factors; we recompute them

_LAYER_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_GLOBAL_RE = re.compile(r"^(\w+)\.(weight|bias)$")


def open_gguf(path: Path):
    """The GGUF's fields and tensors (``gguf_file.GGUFFile``: its header parsed in one quick pass; a
    big-endian file through ``gguf.GGUFReader``, which reads either the same way)."""
    from hetero_core.model.gguf_file import BigEndian, GGUFFile

    try:
        try:
            return GGUFFile(path)
        except BigEndian:
            import gguf

            return gguf.GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read GGUF file {path}: {exc}") from exc


def field_value(reader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def named_token_id(reader, name: str, vocab_size: int) -> int | None:
    """``tokenizer.ggml.<name>_token_id`` where it names a token of the vocabulary (llama.cpp ignores
    one outside it), else None."""
    value = field_value(reader, f"tokenizer.ggml.{name}_token_id")
    return int(value) if value is not None and 0 <= int(value) < vocab_size else None


def gguf_config(reader, path: Path) -> dict[str, Any]:
    """Build an HF ``config.json`` dict from GGUF metadata."""
    arch = field_value(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"unsupported GGUF architecture {arch!r} in {path}; supported: {', '.join(GGUF_ARCHITECTURES)}"
        )

    def key(name: str, default: Any = None) -> Any:
        return field_value(reader, f"{arch}.{name}", default)

    hidden_size = int(key("embedding_length"))
    num_heads = int(key("attention.head_count"))
    names = {t.name for t in reader.tensors}
    vocab_size = key("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].contents())
    config = {
        "architectures": [GGUF_ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_size": hidden_size,
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(key("attention.head_count_kv", num_heads)),
        "head_dim": int(key("attention.key_length", key("rope.dimension_count", hidden_size // num_heads))),
        "intermediate_size": int(key("feed_forward_length")),
        "vocab_size": int(vocab_size),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(key("context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in names,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    if key("rope.scaling.type") == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
    freqs_tensor = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs_tensor is not None:
        config["rope_scaling"] = llama3_scaling_from_factors(
            np.asarray(freqs_tensor.data, dtype=np.float32), config["head_dim"], config["rope_theta"], path
        )
    for gguf_key, hf_key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id")):
        value = field_value(reader, f"tokenizer.ggml.{gguf_key}")
        if value is not None:
            config[hf_key] = int(value)
    return config


def llama3_scaling_from_factors(
    factors: np.ndarray, head_dim: int, theta: float, path: Path
) -> dict[str, Any]:
    """Recover HF ``rope_scaling`` from llama.cpp's ``rope_freqs`` (per-frequency divisors).

    GGUF keeps only the divisors; Llama 3.x always used low/high freq factors 1 and 4 over an 8192
    original context, with ``factor`` the largest divisor. We check that guess reproduces them.
    """
    from hetero_core.model.layers import rope_inv_freq

    scaling = {
        "rope_type": "llama3",
        "factor": float(factors.max()),
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    plain = rope_inv_freq(head_dim, theta, None).numpy()
    scaled = rope_inv_freq(head_dim, theta, scaling).numpy()
    if factors.shape != plain.shape or not np.allclose(plain / factors, scaled, rtol=1e-4):
        raise ModelLoadError(
            f"{path}: its rope_freqs tensor is not Llama-3 RoPE scaling we can reproduce; "
            "convert the original HF checkpoint instead"
        )
    return scaling


def gguf_state_dict(reader, config: dict[str, Any], on_tensor=None) -> dict[str, torch.Tensor]:
    """Dequantize every tensor to fp32 and return it under its HF name; ``on_tensor()`` is called
    after each of ``reader.tensors`` (for progress)."""
    state: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        if on_tensor is not None:
            on_tensor()
        hf_name = hf_tensor_name(tensor.name)
        if hf_name is not None:
            state[hf_name] = gguf_tensor(tensor, config)
    return state


def gguf_tensor(tensor, config: dict[str, Any]) -> torch.Tensor:
    """One of the reader's tensors dequantized to fp32 (q/k of ``llama`` models unpermuted), in memory
    of its own (``checkpoint_tensors.GGUFTensors`` reads a checkpoint this way, one tensor at a time)."""
    from gguf.quants import dequantize

    hf_name = hf_tensor_name(tensor.name) or tensor.name
    unpermute = config["model_type"] == "llama"
    weights = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
    if unpermute and ".q_proj." in hf_name:
        weights = reverse_permute(weights, config["num_attention_heads"])
    elif unpermute and ".k_proj." in hf_name:
        weights = reverse_permute(weights, config["num_key_value_heads"])
    if not weights.flags.writeable or not weights.flags.c_contiguous:
        weights = np.array(weights, dtype=np.float32, order="C")  # own the memory, not the mmap
    return torch.from_numpy(weights)


def hf_tensor_name(gguf_name: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight`` (None: skip)."""
    if match := _LAYER_RE.match(gguf_name):
        layer, base, suffix = match.groups()
        if base in LAYER_TENSOR_NAMES:
            return f"model.layers.{layer}.{LAYER_TENSOR_NAMES[base]}.{suffix}"
    elif match := _GLOBAL_RE.match(gguf_name):
        base, suffix = match.groups()
        if base in IGNORED_TENSORS:
            return None
        if base in GLOBAL_TENSOR_NAMES:
            return f"{GLOBAL_TENSOR_NAMES[base]}.{suffix}"
    raise ModelLoadError(f"unknown GGUF tensor {gguf_name!r}; this GGUF layout is not supported")


def reverse_permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved -> rotate-half RoPE layout)."""
    half_dim = weights.shape[0] // num_heads // 2
    permuted = weights.reshape(num_heads, half_dim, 2, *weights.shape[1:])
    return permuted.swapaxes(2, 1).reshape(weights.shape)
