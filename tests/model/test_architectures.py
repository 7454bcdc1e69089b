"""The architecture hook: registration through discovery, lookup by config.json, refusals by name,
and the per-layer KV layout the paged cache allocates."""

from __future__ import annotations

import types

import pytest
import torch

from hetero_core import ConfigError, ModelLoadError, PluginError
from hetero_core.architectures import (
    KVLayerSpec,
    ModelArchitecture,
    ModelConfig,
    hookimpl,
    kv_bytes_per_token,
    parse_config,
)
from hetero_core.model.cpu.torch_attention import TorchPagedAttention
from hetero_core.model.paged_kv_cache import PagedKVCache
from hetero_core.model.tensor_parallel_plan import check_tensor_parallel_size
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.plugin_system.installed import install_architectures

RAW = {
    "architectures": ["TinyForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 100,
}


def plugin(name: str, architecture) -> types.SimpleNamespace:
    @hookimpl
    def register_model_architectures(register):
        register(name, architecture)

    return types.SimpleNamespace(register_model_architectures=register_model_architectures)


TINY = ModelArchitecture(config=parse_config, build=lambda config, backend: None)


@pytest.fixture
def installed():
    """Install a plugin set's architectures for the test, and forget them afterwards."""

    def install(*plugins):
        plugin_set = load_plugins(entry_points=[], extra_plugins=plugins)
        install_architectures(plugin_set.registry.architectures)
        return plugin_set

    yield install
    install_architectures(None)


def test_core_registers_the_llama_family_through_the_hook():
    plugin_set = load_plugins(entry_points=[])
    core = next(p for p in plugin_set.plugins if p.name == "core")
    assert core.components["architecture"] == [
        "LlamaForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "Qwen2MoeForCausalLM",
        "MixtralForCausalLM",
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
    ]
    assert plugin_set.registry.architectures.plugin_of("Qwen3ForCausalLM") == "core"


def test_a_plugin_architecture_parses_its_config_and_names_itself_in_the_unknown_message(installed):
    installed(("tiny", plugin("TinyForCausalLM", TINY)))
    config = ModelConfig.from_dict({**RAW, "architectures": ["Unknown", "TinyForCausalLM"]})
    assert config.architecture == "TinyForCausalLM" and config.num_key_value_heads == 2
    with pytest.raises(ModelLoadError) as info:
        ModelConfig.from_dict({**RAW, "architectures": ["GPT2LMHeadModel"]})
    assert str(info.value) == (
        "unsupported architecture 'GPT2LMHeadModel'; supported: DeepseekV2ForCausalLM, "
        "DeepseekV3ForCausalLM, "
        "LlamaForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, Qwen2MoeForCausalLM, Qwen3ForCausalLM, "
        "Qwen3MoeForCausalLM, TinyForCausalLM (registered by plugins: core, tiny; a plugin adds one through "
        "register_model_architectures, see docs/models.md)"
    )


def test_two_plugins_registering_one_name_are_both_named(installed):
    installed(("one", plugin("TinyForCausalLM", TINY)), ("two", plugin("TinyForCausalLM", TINY)))
    with pytest.raises(
        PluginError,
        match="architecture 'TinyForCausalLM' is registered by more than one plugin: 'one' and 'two'",
    ):
        ModelConfig.from_dict(RAW)


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("TinyForCausalLM", object(), "register a hetero_core.architectures.ModelArchitecture, got object"),
        ("not a name", TINY, "must be the config.json 'architectures' entry"),
    ],
)
def test_a_bad_registration_fails_its_plugin(name, value, error):
    plugin_set = load_plugins(entry_points=[], extra_plugins=[("bad", plugin(name, value))])
    info = next(p for p in plugin_set.plugins if p.name == "bad")
    assert info.status == "failed" and error in info.error
    assert "TinyForCausalLM" not in plugin_set.registry.architectures.names()


def test_an_architecture_without_tensor_parallel_refuses_more_than_one_rank(installed):
    installed(("tiny", plugin("TinyForCausalLM", TINY)))
    config = ModelConfig.from_dict(RAW)
    check_tensor_parallel_size(config, 1)
    with pytest.raises(
        ConfigError,
        match="architecture TinyForCausalLM \\(plugin 'tiny'\\) does not declare "
        "tensor_parallel; set tensor_parallel_size = 1",
    ):
        check_tensor_parallel_size(config, 2)


def test_kv_bytes_per_token_counts_a_value_inside_the_key_once():
    plain = KVLayerSpec(num_kv_heads=2, key_dim=64, value_dim=64)
    latent = KVLayerSpec(num_kv_heads=1, key_dim=576, value_dim=512, value_in_key=True)
    assert kv_bytes_per_token([plain] * 3, 2) == 3 * 2 * 128 * 2
    assert kv_bytes_per_token([latent], 2) == 576 * 2
    with pytest.raises(ValueError, match="value_in_key needs value_dim <= key_dim"):
        KVLayerSpec(1, 64, 128, value_in_key=True)


def test_the_paged_cache_allocates_copies_and_swaps_each_layers_own_layout():
    layout = (KVLayerSpec(2, 16, 16), KVLayerSpec(1, 24, 8), KVLayerSpec(1, 24, 16, value_in_key=True))
    cache = PagedKVCache(
        TorchPagedAttention(),
        None,  # the layout is given: no config needed
        num_blocks=4,
        block_size=2,
        dtype=torch.float32,
        device=torch.device("cpu"),
        num_swap_blocks=2,
        layout=layout,
    )
    shapes = [(tuple(c.key.shape), tuple(c.value.shape)) for c in cache.layers]
    assert shapes == [
        ((2, 4, 2, 16), (2, 4, 2, 16)),
        ((1, 4, 2, 24), (1, 4, 2, 8)),
        ((1, 4, 2, 24), (1, 4, 2, 16)),
    ]
    latent = cache.layers[2]
    latent.key[:, 1] = torch.arange(48.0).view(1, 2, 24)
    assert torch.equal(latent.value[:, 1], latent.key[:, 1, :, :16])  # the value is the key's first channels
    cache.copy_blocks([(1, 3)])
    cache.swap_out([(3, 0)])
    latent.key.zero_()
    cache.swap_in([(0, 2)])
    assert torch.equal(latent.key[:, 2], torch.arange(48.0).view(1, 2, 24))
    assert len(cache.swap_space[2]) == 1  # one swap tensor for the latent layer, not two


class PlainOnlyBackend:
    name = "plain_only"

    def allocate_kv_cache(self, num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, device):
        return TorchPagedAttention().allocate_kv_cache(
            num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, device
        )


def test_a_backend_without_allocate_kv_layers_holds_plain_layouts_and_refuses_others_by_name():
    cpu = torch.device("cpu")
    plain = PagedKVCache(
        PlainOnlyBackend(),
        None,
        num_blocks=2,
        block_size=2,
        dtype=torch.float32,
        device=cpu,
        layout=(KVLayerSpec(2, 8, 8),) * 3,
    )
    assert len(plain.layers) == 3 and plain.layers[0].key.shape == (2, 2, 2, 8)
    with pytest.raises(
        ModelLoadError, match="attention backend 'plain_only' holds only K and V of one width"
    ):
        PagedKVCache(
            PlainOnlyBackend(),
            None,
            num_blocks=2,
            block_size=2,
            dtype=torch.float32,
            device=cpu,
            layout=(KVLayerSpec(1, 24, 8),),
        )


def test_a_module_without_the_causal_lm_methods_is_refused_naming_the_architecture(installed):
    from hetero_core.model.model_builder import build_model

    installed(
        (
            "tiny",
            plugin(
                "TinyForCausalLM",
                ModelArchitecture(config=parse_config, build=lambda config, backend: torch.nn.Linear(2, 2)),
            ),
        )
    )
    with pytest.raises(
        ModelLoadError,
        match="architecture TinyForCausalLM: its build\\(\\) returned a Linear without "
        "sampled_logits, compute_logits, untie_lm_head, config, backend",
    ):
        build_model(ModelConfig.from_dict(RAW), {})
