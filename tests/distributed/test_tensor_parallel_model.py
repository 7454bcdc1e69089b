"""The sharded model code, in this process: how a checkpoint is cut, and how many collectives a
step makes (a one-rank gloo group stands in for the others: the same code path, every collective)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch.distributed as dist  # noqa: E402

from hetero_core.distributed import process_group  # noqa: E402
from hetero_core.model.config import ModelConfig  # noqa: E402
from hetero_core.model.cpu.torch_attention import TorchPagedAttention  # noqa: E402
from hetero_core.model.loader import read_checkpoint  # noqa: E402
from hetero_core.model.model_builder import build_model  # noqa: E402
from hetero_core.model.tensor_parallel import (  # noqa: E402
    RowParallelLinear,
    TensorParallelShard,
    VocabParallelEmbedding,
    VocabParallelLMHead,
    build_shard,
    shard_checkpoint,
)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from tests.model.tiny_models import save_tiny_model

    directory = tmp_path_factory.mktemp("tp_model") / "llama_bias"
    save_tiny_model("llama_bias", directory)  # biases on q/k/v/o and the MLP: the bias-once rule shows
    return read_checkpoint(directory)


@pytest.fixture
def one_rank_group():
    store = process_group.host_store(1)
    process_group.init_group(store, 0, 1, "gloo")
    yield
    process_group.destroy_group()


def test_each_rank_takes_its_heads_of_q_k_and_v_and_the_ranks_add_up(tiny_checkpoint):
    config, state = tiny_checkpoint
    shards = [shard_checkpoint(state, config, TensorParallelShard(rank, 2)) for rank in range(2)]
    layer = "model.layers.1."
    head = config.head_dim
    for part, heads in (("q_proj", config.num_attention_heads), ("k_proj", config.num_key_value_heads)):
        rows = [s[f"{layer}self_attn.{part}.weight"] for s in shards]
        assert all(r.shape[0] == heads // 2 * head for r in rows)
        assert torch.equal(torch.cat(rows), state[f"{layer}self_attn.{part}.weight"])
    for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):  # row-parallel: input columns
        columns = [s[layer + name] for s in shards]
        assert torch.equal(torch.cat(columns, dim=1), state[layer + name])
    for name in ("self_attn.o_proj.bias", "mlp.down_proj.bias", "input_layernorm.weight"):  # whole everywhere
        assert all(torch.equal(s[layer + name], state[layer + name]) for s in shards)
    embed = [s["model.embed_tokens.weight"] for s in shards]
    assert torch.equal(torch.cat(embed), state["model.embed_tokens.weight"])
    assert embed[1].untyped_storage().nbytes() < state["model.embed_tokens.weight"].untyped_storage().nbytes()


def test_one_all_reduce_per_attention_and_mlp_block_plus_the_embedding(
    tiny_checkpoint, one_rank_group, monkeypatch
):
    config, state = tiny_checkpoint
    backend = TorchPagedAttention()
    reference = build_model(config, dict(state), backend=backend)
    sharded = build_shard(config, dict(state), TensorParallelShard(0, 1), backend=backend)
    layer = sharded.model.layers[0]
    assert isinstance(layer.self_attn.o_proj, RowParallelLinear) and isinstance(
        layer.mlp.down_proj, RowParallelLinear
    )
    assert isinstance(sharded.model.embed_tokens, VocabParallelEmbedding)
    assert isinstance(sharded.lm_head, VocabParallelLMHead)
    assert (
        layer.self_attn.o_proj.linear.bias is None and layer.self_attn.o_proj.bias is not None
    )  # added after

    calls = []
    for name in ("all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all"):
        real = getattr(dist, name)

        def counted_call(*a, _real=real, _name=name, **k):
            calls.append(_name)
            return _real(*a, **k)

        monkeypatch.setattr(dist, name, counted_call)

    logits, counted = {}, {}
    for label, model in (("reference", reference), ("sharded", sharded)):
        calls.clear()
        logits[label] = run_prompt(model, config, [3, 14, 15, 92, 65, 35])
        counted[label] = list(calls)
    assert counted["reference"] == []
    assert counted["sharded"].count("all_reduce") == 1 + 2 * config.num_hidden_layers
    assert (
        counted["sharded"].count("all_gather") == 1
        and len(counted["sharded"]) == 2 + 2 * config.num_hidden_layers
    )
    torch.testing.assert_close(logits["sharded"], logits["reference"], rtol=1e-4, atol=1e-4)


def run_prompt(model, config: ModelConfig, token_ids: list[int]) -> torch.Tensor:
    """Prefill ``token_ids`` in a fresh paged cache; the logits of every position."""
    from hetero_core.engine.scheduling.batch import Batch

    backend = model.backend
    caches = backend.allocate_kv_cache(
        config.num_hidden_layers,
        4,
        16,
        model.config.num_key_value_heads,
        config.head_dim,
        torch.float32,
        torch.device("cpu"),
    )
    n = len(token_ids)
    batch = Batch(
        seq_ids=[0],
        token_ids=token_ids,
        positions=list(range(n)),
        slot_mapping=list(range(n)),
        query_start_loc=[0, n],
        context_lens=[n],
        block_tables=[[0]],
        is_prefill=[True],
        sample=[True],
        num_prompt_tokens=[n],
        seeds=[None],
        block_size=16,
    )
    with torch.inference_mode():
        hidden = model(
            torch.tensor(token_ids),
            torch.arange(n),
            backend.build_metadata(batch, torch.device("cpu")),
            caches,
        )
        return model.compute_logits(hidden)
