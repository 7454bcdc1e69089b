"""What a model-architecture author imports: the registration, the parsed config, the module
contract, the KV layout and the building blocks an architecture reuses (attention with its KV cache,
rotary, Llama's layers and model). See docs/models.md (worked example: ``plugins/hetero-model-phi3``).

    from hetero_core import hookimpl
    from hetero_core.architectures import ModelArchitecture, parse_config

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

The building blocks (``LlamaForCausalLM``, ``LlamaAttention``, ``apply_rotary``, ``KVCache``, ...) import
torch, so they load on first use: importing this module imports no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from hetero_core.model.causal_lm import CausalLM
from hetero_core.model.config import ModelConfig, parse_config, rope_settings
from hetero_core.plugin_system.architectures import (
    ArchitectureRegistry,
    KVLayerSpec,
    ModelArchitecture,
    WeightMapping,
    kv_bytes_per_token,
    same_kv_layout,
    unused_buffers,
)

# ``hookimpl`` is ``hetero_core.hookimpl``, kept here for the code that imported it from this facade
from hetero_core.plugin_system.hookspecs import hookimpl as hookimpl
from hetero_core.plugin_system.installed import installed_architectures

# building block -> the module that defines it (loaded on first use: these import torch)
_BUILDING_BLOCKS = {
    "AttentionBackend": "hetero_core.model.attention",
    "KVCache": "hetero_core.model.attention",
    "RMSNorm": "hetero_core.model.layers",
    "SwiGLU": "hetero_core.model.layers",
    "RotaryEmbedding": "hetero_core.model.layers",
    "apply_rotary": "hetero_core.model.layers",
    "rope_inv_freq": "hetero_core.model.layers",
    "LlamaAttention": "hetero_core.model.llama",
    "LlamaDecoderLayer": "hetero_core.model.llama",
    "LlamaModel": "hetero_core.model.llama",
    "LlamaForCausalLM": "hetero_core.model.llama",
}

__all__ = [
    "ArchitectureRegistry",
    "CausalLM",
    "KVLayerSpec",
    "ModelArchitecture",
    "ModelConfig",
    "WeightMapping",
    "installed_architectures",
    "kv_bytes_per_token",
    "parse_config",
    "rope_settings",
    "same_kv_layout",
    "unused_buffers",
    *_BUILDING_BLOCKS,
]


def __getattr__(name: str):
    module = _BUILDING_BLOCKS.get(name)
    if module is None:
        raise AttributeError(f"module 'hetero_core.architectures' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_BUILDING_BLOCKS))


if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ loads these on demand
    from hetero_core.model.attention import AttentionBackend, KVCache
    from hetero_core.model.layers import RMSNorm, RotaryEmbedding, SwiGLU, apply_rotary, rope_inv_freq
    from hetero_core.model.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
