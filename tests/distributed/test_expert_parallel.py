"""Expert parallelism on the CPU (gloo): a MoE model's experts split across two ranks, tokens
dispatched to them and combined all-to-all, the greedy tokens of one rank; and what is refused."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from hetero_core.builder import build_engine  # noqa: E402
from hetero_core.engine.requests.params import SamplingParams  # noqa: E402
from hetero_core.errors import ConfigError  # noqa: E402
from hetero_core.plugin_system.discovery import load_plugins  # noqa: E402
from hetero_core.settings import load_settings  # noqa: E402

PROMPTS = [[5, 17, 33, 2, 48, 71, 9, 64, 12, 88, 40, 3][: 4 + 2 * i] for i in range(5)]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory):
    from tests.moe.tiny_moe_models import save_tiny_moe_model

    root = tmp_path_factory.mktemp("ep_models")
    for name in ("qwen3_moe", "qwen2_moe", "mixtral"):
        save_tiny_moe_model(name, root / name)
    save_tiny_moe_model("qwen3_moe", root / "qwen3_moe_5", num_experts=5)
    save_tiny_moe_model("qwen2_moe", root / "qwen2_moe_shared_5", shared_expert_intermediate_size=5)
    return root


def greedy_tokens(model_dir, **overrides):
    settings = load_settings(
        model=str(model_dir),
        tokenizer="byte",
        block_size=4,
        max_model_len=128,
        max_num_blocks=16,
        memory_threshold=1.0,
        max_prefill_chunk=7,
        dtype="float32",
        **overrides,
    )
    engine = build_engine(settings, load_plugins(entry_points=[]))
    try:
        return [o.output_token_ids for o in engine.generate(PROMPTS, GREEDY)], engine.stats()
    finally:
        engine.shutdown()


@pytest.mark.parametrize("model", ["qwen3_moe", "qwen2_moe", "mixtral"])
def test_experts_split_over_two_ranks_give_the_greedy_tokens_of_one(moe_dirs, model):
    one, _ = greedy_tokens(moe_dirs / model)
    split, stats = greedy_tokens(moe_dirs / model, tensor_parallel_size=2, enable_expert_parallel=True)
    assert split == one
    assert stats.num_preemptions > 0  # chunked prefills and preemptions too


@pytest.mark.parametrize("model", ["qwen2_moe", "mixtral"])  # qwen2_moe: its shared expert is split too
def test_without_expert_parallelism_each_expert_is_split_as_the_mlp_is(moe_dirs, model):
    one, _ = greedy_tokens(moe_dirs / model)
    assert greedy_tokens(moe_dirs / model, tensor_parallel_size=2)[0] == one


def test_expert_parallelism_is_refused_where_it_cannot_split(moe_dirs, tmp_path):
    with pytest.raises(ConfigError, match="set tensor_parallel_size > 1 or turn enable_expert_parallel off"):
        greedy_tokens(moe_dirs / "qwen3_moe", enable_expert_parallel=True)
    with pytest.raises(ConfigError, match="tensor_parallel_size 2 does not divide the model.s 5 experts"):
        greedy_tokens(moe_dirs / "qwen3_moe_5", tensor_parallel_size=2, enable_expert_parallel=True)
    with pytest.raises(
        ConfigError,
        match="tensor_parallel_size 2 does not divide the model.s "
        "shared_expert_intermediate_size 5; set enable_expert_parallel",
    ):
        greedy_tokens(moe_dirs / "qwen2_moe_shared_5", tensor_parallel_size=2)
    from tests.model.tiny_models import save_tiny_model

    save_tiny_model("llama", tmp_path / "llama")
    with pytest.raises(
        ConfigError, match="enable_expert_parallel needs a mixture-of-experts model; LlamaForCausalLM"
    ):
        greedy_tokens(tmp_path / "llama", tensor_parallel_size=2, enable_expert_parallel=True)


@pytest.fixture
def one_rank_group():
    from hetero_core.distributed import process_group

    store = process_group.host_store(1)
    process_group.init_group(store, 0, 1, "gloo")
    yield
    process_group.destroy_group()


def test_a_rank_holds_only_its_experts_and_dispatches_and_combines_all_to_all(
    moe_dirs, one_rank_group, monkeypatch
):
    import torch
    import torch.distributed as dist

    from hetero_core.model.cpu.torch_attention import TorchPagedAttention
    from hetero_core.model.loader import read_checkpoint
    from hetero_core.model.moe.expert_parallel import ExpertParallelExperts
    from hetero_core.model.tensor_parallel import TensorParallelShard, build_shard

    config, state = read_checkpoint(moe_dirs / "qwen3_moe")
    second = build_shard(config, dict(state), TensorParallelShard(1, 2, expert_parallel=True))
    experts = second.model.layers[0].mlp.experts.local
    assert (experts.first_expert, experts.num_local_experts, experts.num_global_experts) == (4, 4, 8)
    assert torch.equal(experts.down_proj[0], state["model.layers.0.mlp.experts.4.down_proj.weight"])

    model = build_shard(
        config, dict(state), TensorParallelShard(0, 1, expert_parallel=True), backend=TorchPagedAttention()
    )
    block = model.model.layers[0].mlp
    assert isinstance(block.experts, ExpertParallelExperts)
    calls = []
    for name in ("all_to_all_single", "all_gather", "all_reduce"):
        real = getattr(dist, name)
        monkeypatch.setattr(
            dist, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k)
        )
    hidden = torch.randn(5, config.hidden_size)
    with torch.no_grad():
        split = block(hidden)
        block.experts = block.experts.local
        whole = block(hidden)
    assert calls == ["all_to_all_single"] * 4 + ["all_gather"]  # counts, rows, ids; results back; the slices
    torch.testing.assert_close(split, whole)


def test_without_expert_parallelism_a_rank_holds_half_of_each_experts_columns(moe_dirs):
    import torch

    from hetero_core.model.loader import read_checkpoint
    from hetero_core.model.tensor_parallel import TensorParallelShard, shard_checkpoint

    config, state = read_checkpoint(moe_dirs / "qwen2_moe")
    second = shard_checkpoint(state, config, TensorParallelShard(1, 2))
    layer = "model.layers.0.mlp."
    for name, dim in (
        ("experts.3.gate_proj.weight", 0),
        ("experts.3.down_proj.weight", 1),
        ("shared_expert.up_proj.weight", 0),
        ("shared_expert.down_proj.weight", 1),
    ):
        whole = state[layer + name]
        half = whole.shape[dim] // 2
        assert torch.equal(second[layer + name], whole.narrow(dim, half, half)), name
    for name in ("gate.weight", "shared_expert_gate.weight"):  # every rank routes every token the same way
        assert torch.equal(second[layer + name], state[layer + name])
