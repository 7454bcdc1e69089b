"""Hetero: a plugin-based LLM inference engine.

The public names are listed in ``__all__`` and loaded on first use, so ``import hetero_core`` (which
every plugin does through its seam's facade) stays light and never imports torch. A plugin author
marks its hooks with ``hetero_core.hookimpl`` and imports the rest from its seam's facade, each with its
own ``__all__`` (``hetero_core.executor``, ``hetero_core.policy``, ``hetero_core.kv``,
``hetero_core.tokenizer``, ...; ``hetero_core.architectures`` for model architectures); the contract
kits are in ``hetero_core.testing``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "LLM": "hetero_core.llm",
    "SamplingParams": "hetero_core.engine.requests.params",
    "RequestOutput": "hetero_core.engine.requests.outputs",
    "CompletionOutput": "hetero_core.engine.requests.outputs",
    "RequestMetrics": "hetero_core.engine.requests.metrics",
    "HeteroSettings": "hetero_core.settings",
    "load_settings": "hetero_core.settings",
    "SettingsWarning": "hetero_core.settings",
    "HeteroError": "hetero_core.errors",
    "ConfigError": "hetero_core.errors",
    "PluginError": "hetero_core.errors",
    "UnknownComponentError": "hetero_core.errors",
    "InvalidRequestError": "hetero_core.errors",
    "ModelLoadError": "hetero_core.errors",
    "hookimpl": "hetero_core.plugin_system.hookspecs",
    "AsyncLLM": "hetero_core.async_llm",
    "SchedulerPolicy": "hetero_core.engine.scheduling.policy",
    "SortKeyPolicy": "hetero_core.engine.scheduling.policy",
    "SchedulingDecision": "hetero_core.engine.scheduling.policy",
    "SchedulerSnapshot": "hetero_core.engine.scheduling.policy",
    "RequestView": "hetero_core.engine.scheduling.policy",
}

__all__ = ["__version__", *_EXPORTS]

# names a plugin author may look for here -> the facade that exports them (only for the message)
_FACADE_NAMES = {
    "ExecutorContext": "hetero_core.executor",
    "Batch": "hetero_core.executor",
    "ExecutorOutput": "hetero_core.executor",
    "TokenizerContext": "hetero_core.tokenizer",
    "ExecutorContract": "hetero_core.testing",
    "SchedulerPolicyContract": "hetero_core.testing",
    "KVAllocator": "hetero_core.kv",
    "KVAllocatorContract": "hetero_core.testing",
    "GuidedDecodingParams": "hetero_core.structured_output",
    "StructuredOutputContract": "hetero_core.testing",
    "ProposerContext": "hetero_core.speculative",
    "ProposalInput": "hetero_core.speculative",
    "ProposerContract": "hetero_core.testing",
    "TokenizerContract": "hetero_core.testing",
    "LlamaForCausalLM": "hetero_core.architectures",
    "ModelArchitecture": "hetero_core.architectures",
    "ArchitectureContract": "hetero_core.testing",
}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        hint = f"; import it from {_FACADE_NAMES[name]}" if name in _FACADE_NAMES else ""
        raise AttributeError(f"module 'hetero_core' has no attribute {name!r}{hint}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ loads these on demand
    from hetero_core.async_llm import AsyncLLM
    from hetero_core.engine.requests.metrics import RequestMetrics
    from hetero_core.engine.requests.outputs import CompletionOutput, RequestOutput
    from hetero_core.engine.requests.params import SamplingParams
    from hetero_core.engine.scheduling.policy import (
        RequestView,
        SchedulerPolicy,
        SchedulerSnapshot,
        SchedulingDecision,
        SortKeyPolicy,
    )
    from hetero_core.errors import (
        ConfigError,
        HeteroError,
        InvalidRequestError,
        ModelLoadError,
        PluginError,
        UnknownComponentError,
    )
    from hetero_core.llm import LLM
    from hetero_core.plugin_system.hookspecs import hookimpl
    from hetero_core.settings import HeteroSettings, SettingsWarning, load_settings
