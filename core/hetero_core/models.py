"""What a model-architecture author imports: the registration, the parsed config, the module
contract, the KV layout and the hook marker. See docs/models.md (worked example:
``plugins/hetero-model-phi3``).

    from hetero_core.models import ModelArchitecture, hookimpl, parse_config

    def my_config(raw, source):
        return parse_config(raw, source)           # or a frozen ModelConfig subclass with more fields

    def build(config, backend):                     # called on the meta device; weights assigned after
        from my_package.model import MyForCausalLM  # heavy imports inside
        return MyForCausalLM(config, backend)        # a CausalLM

    @hookimpl
    def register_model_architectures(register):
        register("MyForCausalLM", ModelArchitecture(config=my_config, build=build))

Architectures are chosen by a checkpoint's ``config.json`` (its ``architectures`` list), not by
settings. Core's Llama, Qwen2 and Qwen3 register through the same hook.
"""

from __future__ import annotations

from hetero_core.model.causal_lm import CausalLM
from hetero_core.model.config import ModelConfig, parse_config, rope_settings
from hetero_core.plugin_system.architectures import (ArchitectureRegistry, KVLayerSpec, ModelArchitecture,
                                                     WeightMapping, kv_bytes_per_token, same_kv_layout,
                                                     unused_buffers)
from hetero_core.plugin_system.hookspecs import hookimpl
from hetero_core.plugin_system.installed import installed_architectures

__all__ = ["ArchitectureRegistry", "CausalLM", "KVLayerSpec", "ModelArchitecture", "ModelConfig", "WeightMapping",
           "hookimpl", "installed_architectures", "kv_bytes_per_token", "parse_config", "rope_settings",
           "same_kv_layout", "unused_buffers"]
