"""Which pipeline-parallel sizes a model allows, and which decoder layers each stage holds. Imports
no torch.

The layers are split into ``size`` contiguous runs, as evenly as they go; the first
``layers % size`` stages take one more (the last stage also runs the final norm and the LM head).
Every stage needs at least one layer, so ``size`` may not exceed the model's layers. The builder
checks this before any worker starts; the model code checks it again when it builds a stage.
"""

from __future__ import annotations

from hetero_core.errors import ConfigError
from hetero_core.model.config import ModelConfig
from hetero_core.plugin_system.installed import architecture_of, installed_architectures


def stage_layers(num_layers: int, size: int, stage: int) -> range:
    """The decoder layers (global indices) stage ``stage`` of ``size`` holds."""
    base, extra = divmod(num_layers, size)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def check_pipeline_parallel_size(config: ModelConfig, size: int) -> None:
    """Raise a one-line ConfigError unless ``size`` stages fit the model (its architecture declares
    ``pipeline_parallel`` and it has at least ``size`` decoder layers)."""
    if size == 1:
        return
    if not architecture_of(config).pipeline_parallel:
        registry = installed_architectures()
        able = [
            name
            for name in registry.names()
            if name in registry.entries and registry.get(name).pipeline_parallel
        ]
        raise ConfigError(
            f"pipeline_parallel_size {size}: architecture {config.architecture} (plugin "
            f"'{registry.plugin_of(config.architecture)}') does not declare pipeline_parallel; "
            f"set pipeline_parallel_size = 1 (architectures that split into stages: {', '.join(able)})"
        )
    if config.num_hidden_layers < size:
        raise ConfigError(
            f"pipeline_parallel_size {size} exceeds the model's {config.num_hidden_layers} decoder "
            f"layers (each stage needs one); set pipeline_parallel_size to {config.num_hidden_layers} or less"
        )
