"""`hetero bench models`: one row per registered architecture with a bench config, the row's keys,
and an architecture registered by a plugin picked up without edits. No timing is asserted."""

from __future__ import annotations

import json
import types

from hetero_bench.architecture_models import bench_architectures, checkpoint_shapes
from hetero_core.architectures import ModelArchitecture, hookimpl, parse_config
from hetero_core.cli.main import main
from hetero_core.plugin_system.discovery import load_plugins

ROW_KEYS = {
    "architecture",
    "parameters",
    "num_layers",
    "kv_bytes_per_token",
    "batch_1_tokens_per_s",
    "batch_8_tokens_per_s",
    "batch_1_rounds",
    "batch_8_rounds",
}


def test_models_writes_a_row_per_architecture(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "models.json"
    code = main(
        [
            "bench",
            "models",
            "--architectures",
            "LlamaForCausalLM",
            "Qwen3ForCausalLM",
            "--num-hidden-layers",
            "1",
            "--vocab-size",
            "256",
            "--max-tokens",
            "4",
            "--prompt-tokens",
            "4",
            "--rounds",
            "2",
            "--dtype",
            "float32",
            "--json",
            str(path),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(path.read_text())
    assert report["benchmark"] == "models" and "cpu" in report["machine"]
    assert [row["architecture"] for row in report["rows"]] == ["LlamaForCausalLM", "Qwen3ForCausalLM"]
    for row in report["rows"]:
        assert set(row) == ROW_KEYS and len(row["batch_8_rounds"]) == 2 and row["batch_8_tokens_per_s"] > 0
    # the bench config's shape, one layer: 4 KV heads of 64 dims, K and V, 4 bytes each
    assert report["rows"][0]["kv_bytes_per_token"] == 1 * 4 * 64 * 2 * 4
    assert "KV B/token" in out and "Qwen3ForCausalLM" in out


def test_an_architecture_a_plugin_registers_is_benchmarked_without_edits():
    @hookimpl
    def register_model_architectures(register):
        core = load_plugins(entry_points=[]).registry.architectures.get("LlamaForCausalLM")
        register(
            "NewForCausalLM",
            ModelArchitecture(
                config=parse_config,
                build=core.build,
                weights=core.weights,
                bench_config=lambda: {**core.bench_config(), "vocab_size": 64},
            ),
        )
        register("UnbenchedForCausalLM", ModelArchitecture(config=parse_config, build=core.build))

    plugin = types.SimpleNamespace(register_model_architectures=register_model_architectures)
    registry = load_plugins(entry_points=[], extra_plugins=[("new", plugin)]).registry.architectures
    names = [name for name, _ in bench_architectures(registry)]
    assert names == [
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "LlamaForCausalLM",
        "MixtralForCausalLM",
        "NewForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
    ]
    raw = {**registry.get("NewForCausalLM").bench_config(), "architectures": ["NewForCausalLM"]}
    _, shapes = checkpoint_shapes("NewForCausalLM", registry.get("NewForCausalLM"), raw)
    assert (
        shapes["model.embed_tokens.weight"] == (64, 768)
        and "model.layers.0.self_attn.q_proj.weight" in shapes
    )
