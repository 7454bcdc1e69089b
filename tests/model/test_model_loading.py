"""Loading HF directories: single file, sharded, and the errors a user can hit."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from hetero_core.errors import ModelLoadError
from hetero_core.model.fusion import split_state
from hetero_core.model.loader import load_model
from hetero_core.model.safetensors_checkpoint import INDEX_FILE, safetensors_files
from hetero_core.model.source import resolve_model_source
from tests.model.tiny_models import save_tiny_model


def test_sharded_checkpoint_loads_every_shard(tmp_path):
    hf_model = save_tiny_model("qwen3", tmp_path, max_shard_size="40KB")
    shards = safetensors_files(tmp_path)
    assert (tmp_path / INDEX_FILE).is_file() and len(shards) > 2
    model = load_model(tmp_path)
    expected = hf_model.state_dict()
    state = split_state(model.state_dict(), model.config)  # fused q/k/v and gate/up back to HF names
    assert state.keys() == expected.keys()
    for name, tensor in state.items():
        assert torch.equal(tensor, expected[name]), name


def test_dtype_and_tied_embeddings(tiny_model_dirs):
    model_dir, hf_model = tiny_model_dirs["llama_mqa_tied"]
    model = load_model(model_dir, dtype=torch.bfloat16)
    assert model.lm_head is None
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.rotary.inv_freq.dtype == torch.float32  # RoPE frequencies stay fp32
    assert not any(p.requires_grad for p in model.parameters())


def test_index_naming_a_missing_shard(tmp_path):
    save_tiny_model("llama", tmp_path, max_shard_size="40KB")
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    first_shard = next(iter(index["weight_map"].values()))
    (tmp_path / first_shard).unlink()
    with pytest.raises(ModelLoadError, match=f"missing shard.*{first_shard}"):
        load_model(tmp_path)


def test_checkpoint_missing_a_tensor(tmp_path):
    save_tiny_model("llama", tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="missing.*model.layers.1.mlp.up_proj.weight"):
        load_model(tmp_path)


def test_config_shape_disagreeing_with_weights(tmp_path):
    save_tiny_model("llama", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "intermediate_size": 64}))
    with pytest.raises(ModelLoadError, match="does not match its config.json"):
        load_model(tmp_path)


def test_unsupported_architecture_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(
        ModelLoadError,
        match=r"unsupported architecture 'GPT2LMHeadModel'; supported: [^(]*LlamaForCausalLM, "
        r"[^(]*\(registered by plugins: core",
    ):
        load_model(tmp_path)


def test_directory_without_weights(tmp_path):
    save_tiny_model("llama", tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no model.safetensors"):
        load_model(tmp_path)


def test_unknown_local_path_is_not_sent_to_the_hub(tmp_path):
    with pytest.raises(ModelLoadError, match="not found; give a local HF directory"):
        resolve_model_source(tmp_path / "nope")
    with pytest.raises(ModelLoadError, match="not found"):
        resolve_model_source("./relative/nope")


def test_hub_id_goes_through_snapshot_download(monkeypatch, tmp_path):
    import huggingface_hub

    calls = []

    def fake_snapshot_download(repo_id, allow_patterns):
        calls.append((repo_id, allow_patterns))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    assert resolve_model_source("org/model") == tmp_path
    assert calls[0][0] == "org/model" and "*.safetensors" in calls[0][1]

    def failing(repo_id, allow_patterns):
        raise OSError("network unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", failing)
    with pytest.raises(ModelLoadError, match="cannot download 'org/model'.*network unreachable"):
        resolve_model_source("org/model")
