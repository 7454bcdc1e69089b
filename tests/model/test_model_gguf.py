"""GGUF loading: names mapped to HF, llama.cpp's q/k permutation undone, config from metadata."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetero_core.errors import ModelLoadError
from hetero_core.model.cpu.torch_attention import TorchPagedAttention
from hetero_core.model.embedded import find_embedded_gguf
from hetero_core.model.fusion import split_state
from hetero_core.model.gguf_checkpoint import hf_tensor_name, reverse_permute
from hetero_core.model.loader import load_model, read_checkpoint
from tests.model.paged_batches import BlockPool, PagedSequence, step
from tests.model.tiny_gguf import llama_cpp_permute, write_tiny_gguf
from tests.model.tiny_models import hf_logits


def test_reverse_permute_undoes_llama_cpp_permute():
    weights = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    for num_heads in (1, 2, 8):
        assert np.array_equal(reverse_permute(llama_cpp_permute(weights, num_heads), num_heads), weights)


def test_tensor_names():
    assert hf_tensor_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_tensor_name("blk.0.attn_k_norm.weight") == "model.layers.0.self_attn.k_norm.weight"
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("rope_freqs.weight") is None
    with pytest.raises(ModelLoadError, match="unknown GGUF tensor 'blk.0.ssm_a'"):
        hf_tensor_name("blk.0.ssm_a")


@pytest.mark.parametrize("name", ["llama", "llama31_rope", "llama_mqa_tied", "qwen2", "qwen3"])
def test_tiny_gguf_loads_to_hf_logits(name, tiny_model_dirs, tmp_path):
    _, hf_model = tiny_model_dirs[name]
    path = tmp_path / f"{name}.gguf"
    write_tiny_gguf(hf_model, path)
    config, state = read_checkpoint(path)
    assert config.architecture == hf_model.config.architectures[0]
    assert config.tie_word_embeddings == hf_model.config.tie_word_embeddings
    if name == "llama31_rope":  # recovered from the rope_freqs tensor
        assert config.rope_scaling["factor"] == 8.0 and config.rope_scaling["rope_type"] == "llama3"
    for hf_name, tensor in state.items():
        assert torch.equal(tensor, hf_model.state_dict()[hf_name]), hf_name

    model = load_model(path, backend=TorchPagedAttention())
    tokens = list(range(3, 30))
    kv = model.backend.allocate_kv_cache(
        config.num_hidden_layers, 4, 16, config.num_key_value_heads, config.head_dim, torch.float32, "cpu"
    )
    batch = step([(PagedSequence(0, tokens, len(tokens)), len(tokens))], BlockPool(4), 16)
    with torch.inference_mode():
        metadata = model.backend.build_metadata(batch, torch.device("cpu"))
        hidden = model(torch.tensor(batch.token_ids), torch.tensor(batch.positions), metadata, kv)
        logits = model.compute_logits(hidden[-1:])
    assert (logits[0] - hf_logits(hf_model, tokens)[-1]).abs().max() < 1e-4


def test_embedded_weights_equal_transformers_gguf_loading(smollm2_dir):
    """Our dequantized, un-permuted SmolLM2 equals transformers' own GGUF loader (slow: ~20-40 s)."""
    from transformers import AutoModelForCausalLM

    gguf_path = find_embedded_gguf()
    reference = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    expected = reference.state_dict()
    ours = read_checkpoint(smollm2_dir)[1]  # the fp32 weights, converted into the folder on first read
    assert set(ours) == set(expected) - {"lm_head.weight"}  # tied embeddings
    for name, tensor in ours.items():
        assert torch.equal(tensor, expected[name]), name


def test_gguf_converts_once_into_a_loadable_hf_directory(tiny_model_dirs, tmp_path):
    from hetero_core.model.gguf_cache import ensure_gguf_converted

    _, hf_model = tiny_model_dirs["llama"]
    path = tmp_path / "tiny-llama.gguf"
    write_tiny_gguf(hf_model, path)
    model_dir = ensure_gguf_converted(path, tmp_path / "cache")
    assert model_dir.parent == tmp_path / "cache" and (model_dir / "config.json").is_file()
    assert not (model_dir / "model.safetensors").exists()  # fp32 weights only for a load that reads them
    assert ensure_gguf_converted(path, tmp_path / "cache") == model_dir
    model = load_model(model_dir)
    assert (model_dir / "model.safetensors").is_file()
    assert ensure_gguf_converted(path, tmp_path / "cache") == model_dir  # kept, with its weights
    assert (model_dir / "model.safetensors").is_file()
    state = split_state(model.state_dict(), model.config)
    assert state.keys() == hf_model.state_dict().keys()
    for name, tensor in state.items():
        assert torch.equal(tensor, hf_model.state_dict()[name]), name
    with pytest.raises(ModelLoadError, match="GGUF file .* not found"):
        ensure_gguf_converted(tmp_path / "missing.gguf", tmp_path / "cache")
