"""The first layers of a checkpoint as a model of their own, for ``dtype = "auto"``'s timed steps.

Timing every candidate on the whole model cost the embedded model's first start ~35 s (each candidate
loaded, converted, packed and its prepared file written) and would load an 8B model in fp32 (32 GB)
just to time it. A decoder's layers are alike, so a step's time is a line in the layer count: the
embedding, the final norm, the LM head and the step's fixed costs, plus one layer's time per layer.
``probe_layers(n)`` gives the two layer counts to time (``PROBE_LAYERS``; the whole model when it has
no more layers than the larger), ``extrapolate`` the full model's time from theirs.

``first_layers(source, n)`` reads only the tensors those layers, the embedding, the final norm and
the head need (safetensors reads each tensor it is asked for, nothing else) under the config with
``num_hidden_layers = n``; the model is built from them as the loader builds any (``build_model``).
``fewer_layers(model, n)`` is the smaller probe model: the larger one's first ``n`` layers, embedding,
norm and head, the same modules (already packed: packing the embedded model's LM head, 28M of its
135M parameters, was most of the probe's cost when each probe model packed its own).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path

import torch

from hetero_core.model.config import ModelConfig
from hetero_core.model.model_builder import build_model
from hetero_core.model.source import resolve_model_source

PROBE_LAYERS = (1, 3)  # layer counts of the two models timed; their difference is the per-layer time
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def probe_layers(num_layers: int) -> tuple[int, ...]:
    """The layer counts to time for a model of ``num_layers``: ``PROBE_LAYERS``, or the whole model."""
    return PROBE_LAYERS if num_layers > PROBE_LAYERS[-1] else (num_layers,)


def extrapolate(times: dict[int, float], num_layers: int) -> float:
    """A step's time on ``num_layers`` from its times on the models of ``times``' layer counts: the line
    through the two (a per-layer time below zero, noise, counts as zero), or the one time itself."""
    if len(times) == 1:
        return next(iter(times.values()))
    (few, few_s), (more, more_s) = sorted(times.items())
    per_layer = max(0.0, (more_s - few_s) / (more - few))
    return few_s + per_layer * (num_layers - few)


def num_hidden_layers(source: str | Path) -> int:
    return read_config(resolve_model_source(source)).num_hidden_layers


def read_config(source: Path) -> ModelConfig:
    if source.is_dir():
        return ModelConfig.from_dir(source)
    from hetero_core.model.gguf_checkpoint import gguf_config, open_gguf

    return ModelConfig.from_dict(gguf_config(open_gguf(source), source), source=str(source))


def first_layers(source: str | Path, num_layers: int, *, backend, dtype: torch.dtype) -> torch.nn.Module:
    """The model of ``source``'s first ``num_layers`` decoder layers, on the CPU in ``dtype``."""
    source = resolve_model_source(source)
    config = read_config(source)
    state = _first_layer_tensors(source, num_layers)
    config = dataclasses.replace(config, num_hidden_layers=num_layers)
    return build_model(config, state, backend=backend, dtype=dtype)


def fewer_layers(model: torch.nn.Module, num_layers: int) -> torch.nn.Module | None:
    """``model`` with only its first ``num_layers`` decoder layers, sharing every module with it (no
    copy of a weight); None for an architecture not laid out as ``model.model.layers``."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not hasattr(model, "config"):
        return None
    view = copy.copy(model)  # a module's copy shares its children's table: each view gets its own
    view._modules = dict(model._modules)
    view.model = copy.copy(inner)
    view.model._modules = dict(inner._modules)
    view.model.layers = torch.nn.ModuleList(list(layers)[:num_layers])
    view.config = dataclasses.replace(model.config, num_hidden_layers=num_layers)
    if hasattr(view, "fused_decode"):
        view.fused_decode = None  # built per runner, over its own cache
    return view


def _kept(name: str, num_layers: int) -> bool:
    match = _LAYER.search(name)
    return match is None or int(match.group(1)) < num_layers


def _first_layer_tensors(source: Path, num_layers: int) -> dict[str, torch.Tensor]:
    """The tensors of the first ``num_layers`` layers and the rest of the model, each read alone from
    the checkpoint (``checkpoint_tensors``: a converted GGUF's weights converted first where they are
    not yet)."""
    from hetero_core.model.loader import read_checkpoint

    _, state = read_checkpoint(source)
    return {name: state[name] for name in state.keys() if _kept(name, num_layers)}
