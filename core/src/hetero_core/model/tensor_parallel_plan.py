"""Which tensor-parallel sizes a model allows, and what one rank's shard of it holds. Imports no torch.

Each rank takes ``1/size`` of the query heads, of the KV heads, of the MLP's intermediate columns and
of the vocabulary, so ``size`` must divide all four. The builder checks this before any worker
starts; the model code checks it again when it shards a checkpoint.
"""

from __future__ import annotations

from dataclasses import replace

from hetero_core.errors import ConfigError
from hetero_core.model.config import ModelConfig
from hetero_core.plugin_system.installed import architecture_of, installed_architectures

# The config fields each rank takes an equal share of, in the order problems are reported.
SHARDED_FIELDS = ("num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size")


def tensor_parallel_problems(config: ModelConfig, size: int) -> list[str]:
    """The dimensions ``size`` does not divide, with their value (``"num_attention_heads 9"``)."""
    return [f"{name} {getattr(config, name)}" for name in SHARDED_FIELDS if getattr(config, name) % size]


def working_sizes(config: ModelConfig, limit: int = 64) -> list[int]:
    """The tensor-parallel sizes up to ``limit`` that divide every sharded dimension of ``config``."""
    return [size for size in range(1, limit + 1) if not tensor_parallel_problems(config, size)]


def check_tensor_parallel_size(config: ModelConfig, size: int) -> None:
    """Raise a one-line ConfigError (with both numbers, and the sizes that work) unless ``size`` fits."""
    if size > 1 and not architecture_of(config).tensor_parallel:
        registry = installed_architectures()
        able = [
            name
            for name in registry.names()
            if name in registry.entries and registry.get(name).tensor_parallel
        ]
        raise ConfigError(
            f"tensor_parallel_size {size}: architecture {config.architecture} (plugin "
            f"'{registry.plugin_of(config.architecture)}') does not declare tensor_parallel; "
            f"set tensor_parallel_size = 1 (architectures that shard: {', '.join(able)})"
        )
    problems = tensor_parallel_problems(config, size)
    if problems:
        sizes = ", ".join(map(str, working_sizes(config)))
        raise ConfigError(
            f"tensor_parallel_size {size} does not divide the model's {' or '.join(problems)} "
            f"(sizes that divide its heads, KV heads, intermediate_size and vocab_size: {sizes})"
        )


def shard_config(config: ModelConfig, size: int) -> ModelConfig:
    """The config one rank runs with: its share of the heads and of the MLP; the full vocabulary,
    since its embedding takes any token id and its LM head returns full-width (gathered) logits."""
    check_tensor_parallel_size(config, size)
    return replace(
        config,
        num_attention_heads=config.num_attention_heads // size,
        num_key_value_heads=config.num_key_value_heads // size,
        intermediate_size=config.intermediate_size // size,
    )
