"""Build a model from a config and a checkpoint's tensors: its architecture's module (registered
through ``register_model_architectures``) on the meta device (no random init), the tensors assigned
in place after the architecture's weight mapping (the Llama family's fuses q/k/v and gate/up,
``fusion``). The loader and the tensor-parallel sharding both build through here.

Loading streams, so that no model is held twice: the weights go in one group at a time (each decoder
layer, ``model.layers.{i}.``, then the rest: embeddings, final norm, LM head). Within a group the
architecture's weight mapping is called for one module tensor at a time: its checkpoint tensors are
read (``state`` is a lazy ``checkpoint_tensors`` mapping), mapped (fused), converted to the dtype and
dropped before the next is read. The group is assigned, then ``on_group(model, prefix)`` runs (the
CPU executor packs that layer's linears and writes them to its prepared file there). Peak memory:
the resident weights plus one module tensor in its source and mapped forms (and, with ``on_group``
packing, one layer in its plain and packed layouts).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import torch

from hetero_core.errors import ModelLoadError
from hetero_core.model.attention import AttentionBackend, NoAttention
from hetero_core.model.config import ModelConfig
from hetero_core.model.freed_memory import release_freed_memory
from hetero_core.plugin_system.installed import architecture_of

CAUSAL_LM_METHODS = ("forward", "sampled_logits", "compute_logits", "untie_lm_head")
LAYER_PREFIX = re.compile(r"^(model\.layers\.\d+)\.")
REST = ""  # the prefix ``on_group`` gets for the tensors outside the decoder layers (last)

GroupLoaded = Callable[[torch.nn.Module, str], None]


def build_model(
    config: ModelConfig,
    state: Mapping[str, torch.Tensor],
    *,
    backend: AttentionBackend | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    on_group: GroupLoaded | None = None,
    prune: Callable[[torch.nn.Module], None] | None = None,
) -> torch.nn.Module:
    """Instantiate the model without initialising it and assign ``state``'s tensors to it, one layer at
    a time (``backend`` None: weights only, see ``NoAttention``). ``on_group(model, prefix)``: called
    after each layer's tensors are in place (``prefix`` ``model.layers.3``), and last after the others'
    (``prefix`` ``REST``); the layers not yet loaded are still on the meta device then. ``prune(model)``:
    called on the built (meta) module before any tensor is read, to drop the modules it will not run
    (a pipeline stage's, ``pipeline_stage.prune_stage``)."""
    backend = backend if backend is not None else NoAttention()
    architecture = architecture_of(config)
    with torch.device("meta"):
        model = architecture.build(config, backend)
    check_causal_lm(model, config)
    if prune is not None:
        prune(model)
    names = list(model.state_dict().keys())
    weights = architecture.weights
    _check_names(state, weights.checkpoint_names(names, config), weights, config)
    for prefix, group in weight_groups(names):
        tensors = {}
        for name in group:  # one tensor at a time: its source tensors go as soon as it is converted
            tensors.update(_converted(weights.from_checkpoint(state, [name], config), device, dtype))
        _assign(model, tensors)
        del tensors
        if on_group is not None:
            on_group(model, prefix)
        release_freed_memory()  # the group's source tensors, freed into the allocator's heap
    left = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_meta]
    if left:
        raise ModelLoadError(
            f"architecture {config.architecture}: its weight mapping gave no tensor for {left[:5]} "
            f"({len(left)} in all); its from_checkpoint must return every name it is given"
        )
    model.requires_grad_(False)
    return model.eval()


def weight_groups(names: list[str]) -> list[tuple[str, list[str]]]:
    """``names`` grouped by decoder layer (``model.layers.{i}``, in order), the others last (``REST``)."""
    groups: dict[str, list[str]] = {}
    for name in names:
        match = LAYER_PREFIX.match(name)
        groups.setdefault(match.group(1) if match else REST, []).append(name)
    rest = groups.pop(REST, None)
    return [*groups.items(), *([(REST, rest)] if rest else [])]


def _check_names(state: Mapping, expected_names: list[str], weights, config: ModelConfig) -> None:
    """Refuse a checkpoint whose tensor names are not the ones the module takes (nothing read yet)."""
    expected = set(expected_names)
    present = set(state.keys())
    missing = sorted(expected - present)
    unexpected = sorted(k for k in present - expected if not _is_ignored(k, weights, config))
    if missing or unexpected:
        raise ModelLoadError(
            f"checkpoint does not match {config.architecture}: missing {missing[:5]} "
            f"unexpected {unexpected[:5]}"
            f" ({len(missing)} missing, {len(unexpected)} unexpected); is config.json from the same model?"
        )


def _converted(mapped: dict, device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``mapped``'s tensors in ``dtype`` on ``device``, each source let go once converted."""
    return {name: mapped.pop(name).to(device=device, dtype=dtype) for name in list(mapped)}


def _assign(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Put one group's converted tensors into ``model`` (ModelLoadError on a shape mismatch)."""
    try:
        result = model.load_state_dict(tensors, strict=False, assign=True)
    except RuntimeError as exc:  # shape mismatches
        raise ModelLoadError(f"checkpoint does not match its config.json: {exc}") from exc
    if result.unexpected_keys:
        raise ModelLoadError(
            f"the weight mapping gave tensors the module does not have: {result.unexpected_keys[:5]}"
        )


def check_causal_lm(model, config: ModelConfig) -> None:
    """Refuse, naming the architecture, a built module that lacks what ``CausalLM`` promises."""
    missing = [name for name in CAUSAL_LM_METHODS if not callable(getattr(model, name, None))]
    missing += [name for name in ("config", "backend") if not hasattr(model, name)]
    if missing:
        raise ModelLoadError(
            f"architecture {config.architecture}: its build() returned a {type(model).__name__} "
            f"without {', '.join(missing)}; it must implement hetero_core.architectures.CausalLM"
        )


def _is_ignored(name: str, weights, config: ModelConfig) -> bool:
    """A checkpoint tensor the module does not take that is not an error: one its architecture ignores
    (``WeightMapping.ignored``), or the lm_head of a model that ties it to the embeddings."""
    return weights.ignored(name, config) or (config.tie_word_embeddings and name == "lm_head.weight")
