"""``--model random:SHAPE[:DTYPE]``: a model of a given shape with random weights, made once in the
cache, that Hetero and HF transformers load alike."""

from __future__ import annotations

import json

import pytest

from hetero_bench import random_models
from hetero_bench.options import model_path
from hetero_core import HeteroError

torch = pytest.importorskip("torch")

TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache, and a stand-in for the embedded model's tokenizer files."""
    source = tmp_path / "embedded"
    source.mkdir()
    (source / "tokenizer.json").write_text('{"fake": true}')
    (source / "tokenizer_config.json").write_text("{}")
    monkeypatch.setattr(random_models, "tokenizer_source", lambda cache_dir: source)
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path / "cache"))
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY))
    return config


def test_a_random_model_is_made_once_with_the_shape_and_the_tokenizer(cache):
    first = random_models.resolve_random_model(f"random:{cache}")
    assert first == random_models.resolve_random_model(f"random:{cache}")  # reused
    config = json.loads((first / "config.json").read_text())
    assert config["hidden_size"] == 64 and config["vocab_size"] == random_models.VOCAB_SIZE
    assert config["torch_dtype"] == "bfloat16" and (first / "tokenizer.json").read_text() == '{"fake": true}'
    assert not list(first.parent.glob(".*.tmp"))  # nothing left beside it


def test_the_shapes_match_the_model_code_and_the_weights_are_seeded_by_name():
    from hetero_core.model.config import ModelConfig
    from hetero_core.model.fusion import checkpoint_names
    from hetero_core.model.llama import LlamaForCausalLM

    config, _, _ = random_models.parse_spec("random:smollm2-360m")
    assert (
        config["hidden_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["intermediate_size"],
    ) == (960, 32, 15, 5, 2560)
    small = {**config, **TINY}
    names = dict(random_models.tensor_shapes(small))
    with torch.device("meta"):
        model = LlamaForCausalLM(ModelConfig.from_dict(small), backend=None)
    assert sorted(names) == sorted(checkpoint_names(model.state_dict().keys(), ModelConfig.from_dict(small)))
    weight = random_models.random_tensor("model.layers.0.mlp.up_proj.weight", (96, 64))
    assert torch.equal(weight, random_models.random_tensor("model.layers.0.mlp.up_proj.weight", (96, 64)))
    assert 0.015 < weight.std().item() < 0.025
    assert torch.equal(random_models.random_tensor("model.norm.weight", (64,)), torch.ones(64))


def test_both_dtypes_hold_the_same_model(cache):
    from safetensors.torch import load_file

    bf16 = load_file(str(random_models.resolve_random_model(f"random:{cache}") / "model.safetensors"))
    fp32 = load_file(str(random_models.resolve_random_model(f"random:{cache}:float32") / "model.safetensors"))
    assert sorted(bf16) == sorted(fp32)
    for name, tensor in fp32.items():
        assert tensor.dtype == torch.float32 and bf16[name].dtype == torch.bfloat16
        assert torch.equal(tensor.bfloat16(), bf16[name])


def test_large_checkpoints_are_sharded_with_an_index(cache, monkeypatch):
    monkeypatch.setattr(random_models, "SHARD_BYTES", 40_000)
    folder = random_models.resolve_random_model(f"random:{cache}:float32")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1 and not (folder / "model.safetensors").exists()
    transformers = pytest.importorskip("transformers")
    from hetero_core.model.loader import load_model

    hf = transformers.AutoModelForCausalLM.from_pretrained(folder)
    ours = load_model(folder)
    assert torch.equal(hf.model.layers[1].mlp.down_proj.weight, ours.model.layers[1].mlp.down_proj.weight)


def test_the_engine_flag_resolves_random_specs_and_passes_others(cache):
    assert model_path("some/dir") == "some/dir"
    assert model_path(f"random:{cache}").endswith(
        "-bfloat16-" + model_path(f"random:{cache}").rsplit("-", 1)[1]
    )


@pytest.mark.parametrize("spec", ["random:nope", "random:smollm2-360m:float16", "random:/no/such.json"])
def test_an_unknown_shape_or_dtype_names_the_choices(spec):
    with pytest.raises(HeteroError, match="available: smollm2-360m, llama-1b"):
        random_models.parse_spec(spec)
