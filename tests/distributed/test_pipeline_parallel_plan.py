"""Which pipeline-parallel sizes are refused, and how; which layers each stage holds and loads (no
worker starts for these)."""

from __future__ import annotations

import pytest

from hetero_core.cli.main import build_parser
from hetero_core.cli.settings_args import load_cli_settings
from hetero_core.errors import ConfigError
from hetero_core.model.config import ModelConfig
from hetero_core.model.pipeline_plan import check_pipeline_parallel_size, stage_layers

SMOLLM2_LIKE = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "vocab_size": 49152,
}


@pytest.mark.parametrize("layers, size", [(30, 2), (30, 4), (7, 3), (2, 2), (5, 5)])
def test_the_stages_cover_every_layer_once_in_order_as_evenly_as_they_go(layers, size):
    runs = [stage_layers(layers, size, stage) for stage in range(size)]
    assert [i for run in runs for i in run] == list(range(layers))
    assert max(map(len, runs)) - min(map(len, runs)) <= 1 and min(map(len, runs)) >= 1


def test_more_stages_than_layers_is_refused_in_one_line():
    config = ModelConfig.from_dict({**SMOLLM2_LIKE, "num_hidden_layers": 2})
    with pytest.raises(ConfigError) as error:
        check_pipeline_parallel_size(config, 3)
    assert str(error.value) == (
        "pipeline_parallel_size 3 exceeds the model's 2 decoder layers (each stage needs one); "
        "set pipeline_parallel_size to 2 or less"
    )


def test_an_architecture_that_does_not_declare_stages_is_refused():
    from hetero_core.model.moe.architecture import MOE_ARCHITECTURES

    name = sorted(MOE_ARCHITECTURES)[0]
    raw = {**SMOLLM2_LIKE, "architectures": [name], "num_local_experts": 4, "num_experts": 4}
    raw.update(num_experts_per_tok=2, moe_intermediate_size=64)
    with pytest.raises(ConfigError, match=f"architecture {name} .* does not declare pipeline_parallel"):
        check_pipeline_parallel_size(ModelConfig.from_dict(raw), 2)


def test_the_executor_must_support_pipeline_parallelism(make_mock_engine):
    with pytest.raises(ConfigError) as error:
        make_mock_engine(pipeline_parallel_size=2)
    message = str(error.value)
    assert "executor 'mock' does not support pipeline parallelism (pipeline_parallel_size 2)" in message
    assert "--executor torch" in message and "\n" not in message


@pytest.mark.parametrize("argv", [["-pp", "2"], ["--pipeline-parallel-size", "2"]])
def test_run_and_serve_take_the_flag_like_vllm(argv):
    for command in ("run", "serve"):
        args = build_parser().parse_args([command, *argv, "-tp", "3", *(["hi"] if command == "run" else [])])
        settings = load_cli_settings(args)
        assert (settings.pipeline_parallel_size, settings.tensor_parallel_size) == (2, 3)


def test_the_environment_sets_it(monkeypatch):
    from hetero_core.settings import load_settings

    monkeypatch.setenv("HETERO_PIPELINE_PARALLEL_SIZE", "2")
    assert load_settings().pipeline_parallel_size == 2
    with pytest.raises(ConfigError, match="pipeline_parallel_size"):
        load_settings(pipeline_parallel_size=0)


@pytest.mark.parametrize("name", ["llama_mqa_tied", "qwen3"])  # tied embeddings; an LM head of its own
def test_each_stage_loads_only_its_layers_and_its_end_of_the_model(tmp_path, name):
    torch = pytest.importorskip("torch")
    from hetero_core.model.loader import load_model
    from hetero_core.model.pipeline_stage import PipelineStage
    from tests.model.tiny_models import save_tiny_model

    save_tiny_model(name, tmp_path)
    whole = load_model(tmp_path)
    first = load_model(tmp_path, pipeline_stage=PipelineStage(0, 2, range(0, 1), rank=0))
    last = load_model(tmp_path, pipeline_stage=PipelineStage(1, 2, range(1, 2), rank=1))
    assert len(first.model.layers) == len(last.model.layers) == 1 and first.config.num_hidden_layers == 1
    assert first.model.norm is None and first.lm_head is None and first.model.embed_tokens is not None
    tied = whole.config.tie_word_embeddings
    assert last.model.norm is not None and (last.lm_head is None) == tied  # tied: the table is the head
    assert (last.model.embed_tokens is not None) == tied
    for stage, offset in ((first, 0), (last, 1)):  # local layer i is the checkpoint's offset + i
        for key, tensor in stage.model.layers[0].state_dict().items():
            assert torch.equal(tensor, whole.model.layers[offset].state_dict()[key])
    stage_parameters = sum(p.numel() for m in (first, last) for p in m.parameters())
    table = whole.model.embed_tokens.weight.numel() if tied else 0  # on both ends of the pipeline
    assert stage_parameters == sum(p.numel() for p in whole.parameters()) + table
