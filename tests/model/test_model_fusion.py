"""Fused q/k/v and gate/up projections: loaded from HF's separate tensors, split back losslessly."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from hetero_core.errors import ModelLoadError
from hetero_core.model.fusion import checkpoint_names, fuse_checkpoint, split_state
from hetero_core.model.loader import load_model
from tests.model.tiny_models import save_tiny_model


@pytest.mark.parametrize("name", ["llama_bias", "qwen2", "qwen3", "llama_mqa_tied"])
def test_fused_parameters_hold_the_checkpoint_tensors_in_order(name, tiny_model_dirs):
    model_dir, hf_model = tiny_model_dirs[name]
    model = load_model(model_dir)
    layer = model.model.layers[0]
    hf_layer = hf_model.model.layers[0]
    parts = [hf_layer.self_attn.q_proj, hf_layer.self_attn.k_proj, hf_layer.self_attn.v_proj]
    assert torch.equal(layer.self_attn.qkv_proj.weight, torch.cat([p.weight for p in parts]))
    if parts[0].bias is not None:  # Qwen2, and Llama with attention_bias
        assert torch.equal(layer.self_attn.qkv_proj.bias, torch.cat([p.bias for p in parts]))
    gate_up = torch.cat([hf_layer.mlp.gate_proj.weight, hf_layer.mlp.up_proj.weight])
    assert torch.equal(layer.mlp.gate_up_proj.weight, gate_up)

    expected = dict(hf_model.state_dict())
    if model.lm_head is None:  # tied: HF lists the shared tensor twice
        del expected["lm_head.weight"]
    state = split_state(model.state_dict(), model.config)
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[k], expected[k]) for k in expected)


def test_checkpoint_names_and_fuse_round_trip(tiny_model_dirs):
    model_dir, hf_model = tiny_model_dirs["qwen2"]
    model = load_model(model_dir)
    names = list(model.state_dict())
    hf_state = hf_model.state_dict()
    assert set(checkpoint_names(names, model.config)) == set(hf_state)
    fused = fuse_checkpoint(hf_state, names, model.config)
    assert all(torch.equal(fused[k], v) for k, v in model.state_dict().items())


def test_part_with_the_wrong_size_names_the_tensor(tmp_path):
    save_tiny_model("llama", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 4}))
    with pytest.raises(ModelLoadError, match=r"k_proj.weight has 32 rows, the config gives 64"):
        load_model(tmp_path)


def test_parts_disagreeing_on_input_size_are_a_load_error(tmp_path):
    save_tiny_model("llama", tmp_path)
    path = tmp_path / "model.safetensors"
    state = load_file(str(path))
    name = "model.layers.0.self_attn.v_proj.weight"
    state[name] = torch.zeros(state[name].shape[0], state[name].shape[1] + 1)
    save_file(state, str(path))
    with pytest.raises(ModelLoadError, match="does not match its config.json"):
        load_model(tmp_path)
