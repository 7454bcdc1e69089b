"""Which tensor-parallel sizes are refused, and how (no worker starts for these)."""

from __future__ import annotations

import pytest

from hetero_core.cli.main import build_parser
from hetero_core.cli.settings_args import load_cli_settings
from hetero_core.errors import ConfigError
from hetero_core.model.config import ModelConfig
from hetero_core.model.tensor_parallel_plan import check_tensor_parallel_size, shard_config, working_sizes

SMOLLM2_LIKE = {  # SmolLM2-135M's shape: 9 query heads, 3 KV heads
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "vocab_size": 49152,
}


def config(**changes) -> ModelConfig:
    return ModelConfig.from_dict({**SMOLLM2_LIKE, **changes})


def test_a_size_that_does_not_divide_the_heads_is_refused_with_both_numbers():
    with pytest.raises(ConfigError) as error:
        check_tensor_parallel_size(config(), 2)
    message = str(error.value)
    assert "tensor_parallel_size 2" in message
    assert "num_attention_heads 9" in message and "num_key_value_heads 3" in message
    assert "sizes that divide" in message and ": 1, 3)" in message
    assert "\n" not in message


@pytest.mark.parametrize("field, value", [("intermediate_size", 1537), ("vocab_size", 49153)])
def test_the_mlp_and_vocabulary_must_divide_too(field, value):
    with pytest.raises(
        ConfigError, match=f"tensor_parallel_size 3 does not divide the model's {field} {value}"
    ):
        check_tensor_parallel_size(config(**{field: value}), 3)


def test_a_shard_has_its_share_of_heads_and_mlp_and_the_whole_vocabulary():
    shard = shard_config(config(), 3)
    assert (shard.num_attention_heads, shard.num_key_value_heads, shard.intermediate_size) == (3, 1, 512)
    assert shard.vocab_size == 49152 and shard.head_dim == 64 and shard.hidden_size == 576
    assert working_sizes(config()) == [1, 3]


def test_the_executor_must_support_tensor_parallelism(make_mock_engine):
    with pytest.raises(ConfigError) as error:
        make_mock_engine(tensor_parallel_size=2)
    message = str(error.value)
    assert "executor 'mock' does not support tensor parallelism (tensor_parallel_size 2)" in message
    assert "--executor torch" in message


def test_size_one_is_the_default_and_any_executor_runs_it(make_mock_engine):
    engine = make_mock_engine(tensor_parallel_size=1)
    assert engine.generate(["hi"], {"max_tokens": 3})[0].finished
    engine.shutdown()


@pytest.mark.parametrize("argv", [["-tp", "3"], ["--tensor-parallel-size", "3"]])
def test_run_and_serve_take_the_flag_like_vllm(argv):
    for command in ("run", "serve"):
        args = build_parser().parse_args([command, *argv, *(["hi"] if command == "run" else [])])
        assert load_cli_settings(args).tensor_parallel_size == 3


def test_the_environment_sets_it(monkeypatch):
    from hetero_core.settings import load_settings

    monkeypatch.setenv("HETERO_TENSOR_PARALLEL_SIZE", "3")
    assert load_settings().tensor_parallel_size == 3
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        load_settings(tensor_parallel_size=0)
