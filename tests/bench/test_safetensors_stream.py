"""Random checkpoints written one tensor at a time: files safetensors reads back, shards cut as HF's
are, and the 8B shape's plan (8 files of at most 2 GiB) without writing it."""

from __future__ import annotations

import json

import pytest

from hetero_bench import random_models
from hetero_bench.safetensors_stream import plan_shards, write_streamed

torch = pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors")


def test_a_streamed_file_reads_back_with_each_tensor_made_once_in_order(tmp_path):
    from safetensors import safe_open

    entries = [("a.weight", (3, 5)), ("b.bias", (7,)), ("c.weight", (2, 2, 3))]
    made = []

    def make(name, shape):
        made.append(name)
        return torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape).bfloat16()

    write_streamed(tmp_path / "x.safetensors", entries, "bfloat16", make)
    assert made == ["a.weight", "b.bias", "c.weight"]
    with safe_open(str(tmp_path / "x.safetensors"), framework="pt") as f:
        assert sorted(f.keys()) == ["a.weight", "b.bias", "c.weight"] and f.metadata() == {"format": "pt"}
        for name, shape in entries:
            assert torch.equal(f.get_tensor(name), make(name, shape))


def test_a_tensor_unlike_its_header_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"b: made \(4,\) torch.float32, the header says \(3,\) float32"):
        write_streamed(
            tmp_path / "x.safetensors", [("b", (3,))], "float32", lambda name, shape: torch.zeros(4)
        )


def test_shards_are_cut_in_order_under_the_size_and_a_big_tensor_stands_alone():
    entries = [("a", (10,)), ("b", (10,)), ("c", (100,)), ("d", (5,))]
    assert plan_shards(entries, "float32", 80) == [
        [("a", (10,)), ("b", (10,))],
        [("c", (100,))],
        [("d", (5,))],
    ]
    assert plan_shards([], "float32", 80) == []


def test_the_8b_shape_is_llama_3_1_8b_in_8_shards_of_at_most_2_gib():
    config, dtype, name = random_models.parse_spec("random:llama-8b")
    assert (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]) == (
        4096,
        32,
        14336,
    )
    assert (config["num_key_value_heads"], config["head_dim"], config["tie_word_embeddings"]) == (
        8,
        128,
        False,
    )
    entries = random_models.tensor_shapes(config)
    shards = plan_shards(entries, dtype, random_models.SHARD_BYTES)
    sizes = [sum(torch.Size(shape).numel() * 2 for _, shape in shard) for shard in shards]
    assert len(shards) == 8 and max(sizes) <= 2 << 30
    assert 14.5e9 < sum(sizes) < 15.0e9 and entries[-1][0] == "lm_head.weight"
    config_3b, _, _ = random_models.parse_spec("random:llama-3b")
    params_3b = sum(torch.Size(s).numel() for _, s in random_models.tensor_shapes(config_3b))
    assert 2.9e9 < params_3b < 3.1e9


def test_a_sharded_random_model_has_an_index_naming_every_tensor(tmp_path, monkeypatch):
    source = tmp_path / "embedded"
    source.mkdir()
    (source / "tokenizer.json").write_text("{}")
    monkeypatch.setattr(random_models, "tokenizer_source", lambda cache_dir: source)
    monkeypatch.setattr(random_models, "SHARD_BYTES", 30_000)
    config_file = tmp_path / "tiny.json"
    tiny = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 48}
    config_file.write_text(json.dumps({**tiny, "tie_word_embeddings": False}))
    folder = random_models.resolve_random_model(f"random:{config_file}", cache_dir=tmp_path / "cache")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and all((folder / f).is_file() for f in files)
    config = json.loads((folder / "config.json").read_text())
    assert sorted(index["weight_map"]) == sorted(n for n, _ in random_models.tensor_shapes(config))
    assert index["metadata"]["total_size"] == sum(
        torch.Size(s).numel() * 2 for _, s in random_models.tensor_shapes(config)
    )
