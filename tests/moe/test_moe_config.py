"""What a MoE config.json becomes, what is refused, and the checkpoint's names <-> the stacked experts."""

from __future__ import annotations

import json

import pytest
import torch

from hetero_core.errors import ConfigError, ModelLoadError
from hetero_core.model.moe import weights
from hetero_core.model.moe.config import check_expert_parallel, moe_model_config
from hetero_core.model.safetensors_checkpoint import read_safetensors
from tests.moe.tiny_moe_models import TINY_MOE_MODELS


def raw_config(directory) -> dict:
    return json.loads((directory / "config.json").read_text())


def test_each_family_reads_its_own_fields(tiny_moe_dirs):
    qwen3 = moe_model_config(raw_config(tiny_moe_dirs["qwen3_moe"][0]))
    assert qwen3.moe.sparse_layers == (0, 2) and qwen3.moe.norm_topk_prob and qwen3.qk_norm  # layer 1: dense
    assert (qwen3.moe.num_experts, qwen3.moe.num_experts_per_tok, qwen3.moe.moe_intermediate_size) == (
        8,
        2,
        32,
    )
    qwen2 = moe_model_config(raw_config(tiny_moe_dirs["qwen2_moe"][0]))
    assert qwen2.moe.shared_expert_intermediate_size == 48 and not qwen2.moe.norm_topk_prob
    assert qwen2.qkv_bias and not qwen2.o_proj_bias and not qwen2.qk_norm
    mixtral = moe_model_config(raw_config(tiny_moe_dirs["mixtral"][0]))
    assert (
        mixtral.moe.norm_topk_prob
        and mixtral.moe.router_weights_fp32
        and mixtral.moe.moe_intermediate_size == 32
    )
    assert not mixtral.qkv_bias and mixtral.moe.shared_expert_intermediate_size == 0


def test_decoder_sparse_step_leaves_the_other_layers_dense(tiny_moe_dirs):
    raw = {
        **raw_config(tiny_moe_dirs["qwen3_moe"][0]),
        "num_hidden_layers": 6,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
    }
    assert moe_model_config(raw).moe.sparse_layers == (1, 5)


def test_refusals_name_the_field_and_the_fix(tiny_moe_dirs):
    mixtral = raw_config(tiny_moe_dirs["mixtral"][0])
    with pytest.raises(
        ModelLoadError, match="sliding_window 4096 is not supported.*set sliding_window to null"
    ):
        moe_model_config({**mixtral, "sliding_window": 4096})
    with pytest.raises(
        ModelLoadError, match="num_experts_per_tok 9 must be between 1 and the number of experts"
    ):
        moe_model_config({**mixtral, "num_experts_per_tok": 9})
    qwen3 = raw_config(tiny_moe_dirs["qwen3_moe"][0])
    with pytest.raises(ModelLoadError, match="missing required field 'moe_intermediate_size'"):
        moe_model_config({k: v for k, v in qwen3.items() if k != "moe_intermediate_size"})


def test_expert_parallel_needs_experts_that_divide_by_the_ranks(tiny_moe_dirs):
    config = moe_model_config(raw_config(tiny_moe_dirs["qwen3_moe"][0]))
    check_expert_parallel(config, 4)
    with pytest.raises(
        ConfigError, match="tensor_parallel_size 3 does not divide the model's 8 experts.*1, 2, 4, 8"
    ):
        check_expert_parallel(config, 3)


@pytest.mark.parametrize("name", list(TINY_MOE_MODELS))
def test_per_expert_checkpoint_tensors_stack_and_split_back(name, tiny_moe_dirs):
    from hetero_core.model.moe.model import MoeForCausalLM

    directory, hf_model = tiny_moe_dirs[name]
    config = moe_model_config(raw_config(directory))
    with torch.device("meta"):
        model = MoeForCausalLM(config, None)
    names = list(model.state_dict())
    state = read_safetensors(directory)
    assert sorted(weights.checkpoint_names(names, config)) == sorted(state)
    tensors = weights.from_checkpoint(state, names, config)
    hf_state = hf_model.state_dict()  # transformers 5 stacks the experts in memory, as we do
    layer = f"model.layers.{config.moe.sparse_layers[0]}.mlp.experts."
    for part in ("gate_up_proj", "down_proj"):
        assert torch.equal(tensors[layer + part], hf_state[layer + part])
    back = weights.to_checkpoint(tensors, config)
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
