"""Checkpoint tensors an architecture deliberately ignores (``WeightMapping.ignored``): DeepSeek-V3's
multi-token-prediction layer (``model.layers.<num_hidden_layers>.*``, ``num_nextn_predict_layers``)
and saved RoPE buffers load as if absent; any other unexpected tensor is still refused by name."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from hetero_core.errors import ModelLoadError
from hetero_core.model.attention import KVCache
from hetero_core.model.cpu.torch_attention import TorchPagedAttention
from hetero_core.model.loader import load_model
from tests.model.paged_batches import BlockPool, PagedSequence, step
from tests.model.tiny_mla_models import VOCAB, save_tiny_mla_model
from tests.model.tiny_models import save_tiny_model


def mtp_layer(state: dict[str, torch.Tensor], index: int) -> dict[str, torch.Tensor]:
    """A next-token-prediction layer as DeepSeek-V3 checkpoints carry it: a decoder layer (here the
    last one's tensors, renamed) plus its own norms, projection and head."""
    last, prefix = f"model.layers.{index - 1}.", f"model.layers.{index}."
    layer = {prefix + name[len(last) :]: t.clone() for name, t in state.items() if name.startswith(last)}
    hidden = state["model.norm.weight"].shape[0]
    return {
        **layer,
        prefix + "enorm.weight": torch.ones(hidden),
        prefix + "hnorm.weight": torch.ones(hidden),
        prefix + "eh_proj.weight": torch.randn(hidden, 2 * hidden),
        prefix + "shared_head.norm.weight": torch.ones(hidden),
        prefix + "shared_head.head.weight": torch.randn(VOCAB, hidden),
    }


def with_tensors(source, target, extra: dict[str, torch.Tensor], **config_changes):
    """A copy of checkpoint ``source`` at ``target`` with ``extra`` tensors and ``config_changes``."""
    shutil.copytree(source, target)
    state = load_file(str(target / "model.safetensors"))
    save_file({**state, **extra}, str(target / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, **config_changes}))
    return target


def logits(model_dir) -> torch.Tensor:
    model = load_model(model_dir, backend=TorchPagedAttention())
    tokens = torch.randint(0, VOCAB, (21,), generator=torch.Generator().manual_seed(3)).tolist()
    batch = step([(PagedSequence(0, tokens, len(tokens)), len(tokens))], BlockPool(16), 4)
    caches = [
        KVCache(torch.zeros(1, 16, 4, model.config.latent_dim), torch.zeros(1, 16, 4, 0))
        for _ in range(model.config.num_hidden_layers)
    ]
    with torch.inference_mode():
        metadata = model.backend.build_metadata(batch, torch.device("cpu"))
        hidden = model(torch.tensor(batch.token_ids), torch.tensor(batch.positions), metadata, caches)
        return model.compute_logits(hidden)


@pytest.fixture(scope="module")
def v3(tmp_path_factory):
    """A tiny DeepSeek-V3 checkpoint (2 layers, config.json's num_nextn_predict_layers 1, as transformers
    writes it) and its tensors."""
    directory = tmp_path_factory.mktemp("v3") / "plain"
    save_tiny_mla_model("deepseek_v3", directory, first_k_dense_replace=1)
    assert json.loads((directory / "config.json").read_text())["num_nextn_predict_layers"] == 1
    return directory, load_file(str(directory / "model.safetensors"))


def test_a_v3_checkpoint_with_its_mtp_layer_loads_and_gives_the_same_logits(v3, tmp_path):
    directory, state = v3
    extra = mtp_layer(state, 2)
    assert any(".mlp.experts.0." in name for name in extra)  # the MTP layer has its own experts
    with_mtp = with_tensors(directory, tmp_path / "mtp", extra)
    torch.testing.assert_close(logits(with_mtp), logits(directory), atol=0, rtol=0)  # same weights, same code


def test_undeclared_tensors_are_still_refused_by_name(v3, tmp_path):
    directory, state = v3
    cases = {
        "no_mtp": (mtp_layer(state, 2), {"num_nextn_predict_layers": 0}, "model.layers.2."),  # none declared
        "past_mtp": (mtp_layer(state, 3), {}, "model.layers.3."),  # one MTP layer: index 2 only
        "stray": ({"model.extra.weight": torch.zeros(3)}, {}, "model.extra.weight"),
    }
    for case, (extra, config_changes, name) in cases.items():
        broken = with_tensors(directory, tmp_path / case, extra, **config_changes)
        with pytest.raises(ModelLoadError, match=f"unexpected \\['{name}"):
            load_model(broken)


def test_saved_rope_buffers_are_ignored_by_the_default_mapping(tmp_path):
    directory = tmp_path / "llama"
    save_tiny_model("llama", directory)
    state = load_file(str(directory / "model.safetensors"))
    buffers = {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": torch.ones(8) for i in range(2)}
    save_file({**state, **buffers}, str(directory / "model.safetensors"), metadata={"format": "pt"})
    assert load_model(directory).config.architecture == "LlamaForCausalLM"
