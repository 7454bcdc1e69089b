"""The MoE layer against transformers' own: the router, the grouped experts, the experts split by rank."""

from __future__ import annotations

import pytest
import torch
import transformers

from hetero_core.model.moe.experts import Experts, group_by_expert
from hetero_core.model.moe.router import TopKRouter

HIDDEN, EXPERTS, INTER, TOP_K = 32, 8, 16, 2


def hf_modeling(family: str):
    """transformers' modeling module of ``family``, imported when a test runs: importing it at collection
    imports triton for the GPU, before tests/triton's conftest can set it up for the CPU interpreter."""
    import importlib

    return importlib.import_module(f"transformers.models.{family}.modeling_{family}")


def hf_config(norm_topk_prob: bool):
    return transformers.Qwen3MoeConfig(
        hidden_size=HIDDEN,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        moe_intermediate_size=INTER,
        norm_topk_prob=norm_topk_prob,
    )


@pytest.mark.parametrize("normalize", [False, True])
def test_the_router_picks_and_weighs_as_qwen3_moe_does(normalize):
    hf = hf_modeling("qwen3_moe").Qwen3MoeTopKRouter(hf_config(normalize))
    torch.nn.init.normal_(hf.weight, std=0.3)
    ours = TopKRouter(EXPERTS, HIDDEN, TOP_K, normalize)
    ours.load_state_dict(hf.state_dict())
    hidden = torch.randn(13, HIDDEN)
    _, hf_weights, hf_ids = hf(hidden)
    weights, ids = ours(hidden)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights)
    assert torch.allclose(weights.sum(-1), torch.ones(13)) == normalize


def test_mixtral_renormalises_and_keeps_fp32_weights():
    config = transformers.MixtralConfig(
        hidden_size=HIDDEN, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K
    )
    hf = hf_modeling("mixtral").MixtralTopKRouter(config)
    torch.nn.init.normal_(hf.weight, std=0.3)
    ours = TopKRouter(EXPERTS, HIDDEN, TOP_K, normalize=True, fp32_weights=True)
    ours.load_state_dict(hf.state_dict())
    hidden = torch.randn(9, HIDDEN, dtype=torch.bfloat16)
    _, hf_weights, hf_ids = hf.to(torch.bfloat16)(hidden)
    ours = ours.to(torch.bfloat16)
    weights, ids = ours(hidden)
    assert weights.dtype == torch.float32 and torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights)


def hf_experts():
    experts = hf_modeling("qwen3_moe").Qwen3MoeExperts(hf_config(True))
    torch.nn.init.normal_(experts.gate_up_proj, std=0.2)
    torch.nn.init.normal_(experts.down_proj, std=0.2)
    return experts


def test_grouped_experts_equal_transformers_experts():
    hf = hf_experts()
    ours = Experts(EXPERTS, HIDDEN, INTER)
    ours.load_state_dict(hf.state_dict())
    hidden = torch.randn(21, HIDDEN)
    weights, ids = torch.rand(21, TOP_K), torch.randint(0, EXPERTS, (21, TOP_K))
    ids[:, 1] = (ids[:, 0] + 1 + ids[:, 1] % (EXPERTS - 1)) % EXPERTS  # two different experts per token
    with torch.no_grad():
        torch.testing.assert_close(ours(hidden, weights, ids), hf(hidden, ids, weights))


def test_only_the_experts_some_token_chose_run_once_each_over_all_their_tokens():
    ids = torch.tensor([[5, 2], [2, 7], [5, 2]])
    groups = group_by_expert(ids)
    assert groups.spans == ((2, 0, 3), (5, 3, 5), (7, 5, 6))
    assert groups.token_rows.tolist() == [0, 1, 2, 0, 2, 1]  # each expert's tokens in token order
    ran = []
    experts = Experts(EXPERTS, HIDDEN, INTER)
    experts.run_expert = lambda expert, rows: ran.append((expert, rows.shape[0])) or rows
    experts(torch.randn(3, HIDDEN), torch.ones(3, 2), ids)
    assert ran == [(2, 3), (5, 2), (7, 1)]


def test_experts_split_in_two_add_up_to_all_of_them():
    hf = hf_experts()
    whole = Experts(EXPERTS, HIDDEN, INTER)
    whole.load_state_dict(hf.state_dict())
    halves = []
    for first in (0, EXPERTS // 2):
        half = Experts(EXPERTS // 2, HIDDEN, INTER, first_expert=first, num_global_experts=EXPERTS)
        half.load_state_dict(
            {name: tensor[first : first + EXPERTS // 2] for name, tensor in hf.state_dict().items()}
        )
        halves.append(half)
    hidden = torch.randn(17, HIDDEN)
    weights, ids = torch.rand(17, TOP_K), torch.randint(0, EXPERTS, (17, TOP_K))
    with torch.no_grad():
        torch.testing.assert_close(
            halves[0](hidden, weights, ids) + halves[1](hidden, weights, ids), whole(hidden, weights, ids)
        )
