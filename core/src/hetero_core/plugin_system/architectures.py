"""Model architectures: what a plugin registers through ``register_model_architectures``, and the
registry that picks one by a checkpoint's ``config.json`` (its ``architectures`` list).

Not a seam chosen by settings: the checkpoint names its architecture. Imports no torch; an
architecture's callables import their model code when called.

The process's architectures (the ones model loading looks names up in) are in ``installed``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hetero_core.errors import ModelLoadError, PluginError


@dataclass(frozen=True)
class KVLayerSpec:
    """What one decoder layer keeps per token in the paged KV cache.

    ``num_kv_heads`` heads of a ``key_dim``-wide key and a ``value_dim``-wide value. Plain attention
    (GQA/MHA): key_dim == value_dim == head_dim. ``value_in_key``: the value is the first
    ``value_dim`` channels of the key and is not stored again (MLA: one latent vector plus the RoPE
    key per token, ``num_kv_heads=1, key_dim=kv_lora_rank + rope_dim, value_dim=kv_lora_rank``)."""

    num_kv_heads: int
    key_dim: int
    value_dim: int
    value_in_key: bool = False

    def __post_init__(self):
        if self.num_kv_heads < 1 or self.key_dim < 1 or self.value_dim < 1:
            raise ValueError(f"KVLayerSpec needs positive heads and widths, got {self}")
        if self.value_in_key and self.value_dim > self.key_dim:
            raise ValueError(f"KVLayerSpec: value_in_key needs value_dim <= key_dim, got {self}")

    @property
    def is_plain(self) -> bool:
        """K and V the same width, stored separately: the layout every attention backend holds."""
        return self.key_dim == self.value_dim and not self.value_in_key

    def elements_per_token(self) -> int:
        """Cache elements one token takes in this layer."""
        return self.num_kv_heads * (self.key_dim + (0 if self.value_in_key else self.value_dim))


def kv_bytes_per_token(layout: Sequence[KVLayerSpec], element_size: int) -> int:
    """Bytes of KV cache per token over all layers, at ``element_size`` bytes per element."""
    return sum(spec.elements_per_token() for spec in layout) * element_size


def same_kv_layout(config: Any) -> tuple[KVLayerSpec, ...]:
    """Every layer ``num_key_value_heads`` heads of ``head_dim`` keys and values (the Llama family's)."""
    spec = KVLayerSpec(config.num_key_value_heads, config.head_dim, config.head_dim)
    return (spec,) * config.num_hidden_layers


def unused_buffers(name: str, config: Any) -> bool:
    """Buffers some exporters save that carry no weights (``rotary_emb.inv_freq``): ``WeightMapping``'s
    default ``ignored``."""
    return name.endswith("rotary_emb.inv_freq")


@dataclass(frozen=True)
class WeightMapping:
    """Checkpoint tensors (Hugging Face names) <-> the module's state dict.

    ``checkpoint_names(model_names, config)``: the checkpoint names that make up those parameters;
    ``from_checkpoint(state, model_names, config)``: the module's tensors by name (e.g. q/k/v
    concatenated into one ``qkv_proj``); ``to_checkpoint(state, config)``: the inverse (tests, export);
    ``ignored(name, config)``: True for a checkpoint tensor the architecture deliberately does not use
    (DeepSeek-V3's multi-token-prediction layer), which loading skips instead of refusing it as
    unexpected. The default maps every name to itself and ignores ``unused_buffers``.

    Loading calls ``from_checkpoint`` with one model name at a time and a lazy, read-only mapping
    (``model.checkpoint_tensors``: each ``state[name]`` reads that tensor from disk, so read it once),
    so that the weights stream (``model.model_builder``): a mapping computes each of the module's
    tensors from the checkpoint tensors it needs, whatever other names it is given with."""

    checkpoint_names: Callable[[Iterable[str], Any], list[str]] = lambda names, config: list(names)
    from_checkpoint: Callable[[dict, Iterable[str], Any], dict] = lambda state, names, config: {
        name: state[name] for name in names
    }
    to_checkpoint: Callable[[dict, Any], dict] = lambda state, config: dict(state)
    ignored: Callable[[str, Any], bool] = unused_buffers

    @classmethod
    def from_module(
        cls,
        module: str,
        checkpoint_names: str = "checkpoint_names",
        from_checkpoint: str = "from_checkpoint",
        to_checkpoint: str = "to_checkpoint",
        ignored: Callable[[str, Any], bool] = unused_buffers,
    ) -> WeightMapping:
        """The mapping whose three functions are ``module``'s functions of those names, imported on
        first use (so registering an architecture imports no torch)."""

        def imported(name: str) -> Callable:
            def call(*args):
                return getattr(importlib.import_module(module), name)(*args)

            call.__name__ = call.__qualname__ = f"{module}.{name}"
            return call

        return cls(imported(checkpoint_names), imported(from_checkpoint), imported(to_checkpoint), ignored)


IDENTITY_WEIGHTS = WeightMapping()


@dataclass(frozen=True)
class ModelArchitecture:
    """One Hugging Face ``architectures`` name's model, as the engine needs it.

    - ``config(raw, source) -> ModelConfig``: the parsed ``config.json`` (a frozen ``ModelConfig``
      or a subclass with extra fields); refuse what the model code cannot run (``ModelLoadError``).
    - ``build(config, backend) -> nn.Module``: the module (``hetero_core.architectures.CausalLM``),
      called under ``torch.device("meta")``; the loader assigns every weight afterwards.
    - ``weights``: checkpoint names <-> the module's state dict, and the checkpoint names it ignores
      (``WeightMapping``).
    - ``kv_layout(config) -> [KVLayerSpec per layer]``: what the paged cache holds per token.
    - ``tensor_parallel``: the module shards the way core's Megatron sharding expects (Llama names:
      q/k/v/o, gate/up/down, embed_tokens, lm_head); False: ``tensor_parallel_size > 1`` is refused.
    - ``pipeline_parallel``: the module splits into stages the way core's pipeline stages expect
      (``model.embed_tokens``, ``model.layers`` of decoder layers mapping ``(hidden, residual)`` to
      ``(hidden, residual)``, ``model.norm``, ``lm_head``; ``model.pipeline_stage``); False:
      ``pipeline_parallel_size > 1`` is refused.
    - ``bench_config() -> dict``: a raw ``config.json`` of ~100-200M parameters, for
      ``hetero bench models`` (random weights); None: the architecture is not benchmarked.
    - ``hf_class``: the transformers class name that runs the same checkpoints (for tests, docs).
    """

    config: Callable[[dict, str], Any]
    build: Callable[[Any, Any], Any]
    kv_layout: Callable[[Any], Sequence[KVLayerSpec]] = same_kv_layout
    weights: WeightMapping = IDENTITY_WEIGHTS
    tensor_parallel: bool = False
    pipeline_parallel: bool = False
    bench_config: Callable[[], dict] | None = None
    hf_class: str | None = None


@dataclass
class ArchitectureRegistry:
    """HF architecture name -> (``ModelArchitecture``, the plugin that registered it)."""

    entries: dict[str, tuple[ModelArchitecture, str]] = field(default_factory=dict)
    conflicts: dict[str, list[str]] = field(default_factory=dict)

    def add(self, name: str, architecture: ModelArchitecture, plugin: str) -> None:
        if name in self.entries or name in self.conflicts:
            owners = self.conflicts.setdefault(
                name, [self.entries.pop(name)[1]] if name in self.entries else []
            )
            owners.append(plugin)
            return
        self.entries[name] = (architecture, plugin)

    def names(self) -> list[str]:
        return sorted({*self.entries, *self.conflicts})

    def plugins(self) -> list[str]:
        """The plugins that register architectures, core first."""
        owners = {plugin for _, plugin in self.entries.values()}
        owners.update(p for plugins in self.conflicts.values() for p in plugins)
        return sorted(owners, key=lambda p: (p != "core", p))

    def plugin_of(self, name: str) -> str:
        return self.entries[name][1]

    def get(self, name: str) -> ModelArchitecture:
        if name in self.conflicts:
            owners = " and ".join(f"'{p}'" for p in self.conflicts[name])
            raise PluginError(
                f"architecture '{name}' is registered by more than one plugin: {owners}; "
                "uninstall one of them or restrict plugins with the 'plugins' allow-list"
            )
        if name not in self.entries:
            raise ModelLoadError(self._unknown(name))
        return self.entries[name][0]

    def for_config(self, raw: dict) -> tuple[str, ModelArchitecture]:
        """The first of ``raw["architectures"]`` that is registered, with its architecture."""
        names = raw.get("architectures") or []
        for name in names:
            if name in self.entries or name in self.conflicts:
                return name, self.get(name)
        raise ModelLoadError(self._unknown(names[0] if names else "<none given>"))

    def _unknown(self, name: str) -> str:
        return (
            f"unsupported architecture '{name}'; supported: {', '.join(self.names()) or '(none)'} "
            f"(registered by plugins: {', '.join(self.plugins())}; "
            "a plugin adds one through register_model_architectures, see docs/models.md)"
        )
