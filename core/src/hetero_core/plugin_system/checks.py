"""Plugin checks: a component that cannot work is refused when the engine is built, not mid-run.

Two moments:
- ``check_registration`` (called by ``register()`` while plugins load): the name is usable in
  settings and environment variables, the factory is callable with the seam's arguments
  (``inspect.signature``), the options model is a pydantic model, every trait is one the seam
  declares (``seams.py``) with a value of its type. A failure marks the plugin as failed, like any
  load error.
- ``check_components`` (called by ``builder.build_engine`` once the selected components are
  built): the object each factory returned has the methods and attributes core will call.

Every message names the component, its plugin and distribution, what is wrong and the fix.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

from hetero_core.errors import PluginError
from hetero_core.plugin_system.seams import SEAM_BY_NAME
from hetero_core.suggest import did_you_mean

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")

# seam -> the arguments core passes to a factory of that seam
FACTORY_ARGUMENTS = {
    "tokenizer": ("ctx",),
    "scheduler_policy": ("options",),
    "kv_allocator": ("num_blocks", "block_size", "options"),
    "executor": ("ctx",),
    "structured_output": ("ctx",),
    "kv_connector": ("ctx",),
    "speculative_proposer": ("ctx",),
}

# seam -> (methods core calls, attributes core reads) on the object a factory returns
REQUIRED = {
    "tokenizer": (("encode", "decode", "encode_chat"), ("eos_token_id", "vocab_size")),
    "scheduler_policy": (("decide",), ()),
    "kv_allocator": (  # hetero_core.kv.KVAllocator
        ("num_blocks_for", "get_computed_blocks", "allocate_slots", "cache_blocks", "free"),
        (
            "num_blocks",
            "block_size",
            "has_prefix_cache",
            "has_copy_on_write",
            "num_free_blocks",
            "num_cached_blocks",
        ),
    ),
    "executor": (("execute", "shutdown"), ()),
    "structured_output": (("compile", "new_state"), ()),
    "kv_connector": (("publish", "fetch", "discard", "close"), ()),
    "speculative_proposer": (("propose", "release", "shutdown"), ()),
}

SIGNATURES = {
    "tokenizer": "encode(text), decode(token_ids), encode_chat(messages); eos_token_id, vocab_size",
    "scheduler_policy": (
        "decide(snapshot) -> SchedulingDecision (or subclass SortKeyPolicy and write key(request))"
    ),
    "kv_allocator": (
        "hetero_core.kv.KVAllocator: num_blocks_for, get_computed_blocks, allocate_slots, cache_blocks, "
        "free; num_blocks, block_size, has_prefix_cache, has_copy_on_write, num_free_blocks, "
        "num_cached_blocks"
    ),
    "executor": "execute(batch) -> ExecutorOutput, shutdown()",
    "structured_output": "compile(GuidedDecodingParams) -> grammar, new_state(grammar) -> GrammarState",
    "kv_connector": (
        "publish(transfer_id, KVBlocks) -> address, fetch(address, transfer_id, timeout) -> KVBlocks, "
        "discard(transfer_id), close()"
    ),
    "speculative_proposer": "hetero_core.speculative.Proposer: propose(inputs) -> token ids per input, "
    "release(seq_id), shutdown()",
}


def check_registration(
    seam: str, name: Any, factory: Any, options: Any, traits: dict[str, Any] | None = None
) -> None:
    """Raise ValueError (the loader records it as the plugin's failure) if a registration is unusable."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ValueError(
            f"{seam} name {name!r} is not usable in settings; use letters, digits, '-' and '_' "
            "(starting with a letter or digit)"
        )
    arguments = FACTORY_ARGUMENTS[seam]
    call = f"factory({', '.join(arguments)})"
    if not callable(factory):
        raise ValueError(
            f"{seam} '{name}': the factory must be callable as {call}, got {type(factory).__name__}"
        )
    problem = _signature_problem(factory, len(arguments))
    if problem:
        raise ValueError(f"{seam} '{name}': core calls {call} but the factory {problem}; fix its parameters")
    if options is not None and not _is_pydantic_model(options):
        raise ValueError(
            f"{seam} '{name}': options must be a pydantic BaseModel subclass (or None), got {options!r}"
        )
    for trait, value in (traits or {}).items():
        problem = _trait_problem(seam, trait, value)
        if problem:
            raise ValueError(f"{seam} '{name}': {problem}")


def check_components(plugins, built: dict[str, tuple[Any, Any]]) -> None:
    """``built``: seam -> (Component, the object its factory returned). Raise PluginError on the
    first object that lacks what core calls."""
    for seam, (component, obj) in built.items():
        methods, attributes = REQUIRED[seam]
        missing = [m for m in methods if not callable(getattr(obj, m, None))]
        missing += [a for a in attributes if not hasattr(obj, a)]
        problem = None
        if missing:
            problem = f"returned a {type(obj).__name__} without {', '.join(missing)}"
        elif seam == "tokenizer":
            problem = _tokenizer_problem(obj)
        if problem:
            raise PluginError(
                f"{_describe(plugins, component)}: its factory {problem}; "
                f"a {component.seam.replace('_', ' ')} "
                f"needs {SIGNATURES[seam]} (see docs/hooks.md); fix the plugin or select another {seam}"
            )


def _trait_problem(seam: str, trait: str, value: Any) -> str | None:
    """Why ``trait=value`` is not a trait of ``seam`` (the seam's declaration in ``seams.py``), or None."""
    declaration = SEAM_BY_NAME[seam]
    spec = declaration.trait(trait)
    if spec is not None:
        return spec.problem(value)
    names = [t.name for t in declaration.traits]
    if not names:
        return f"unknown trait {trait!r}; a {declaration.label} takes no traits (remove it)"
    return f"unknown trait {trait!r}{did_you_mean(trait, names)} (traits: {', '.join(names)})"


def _signature_problem(factory: Callable, num_arguments: int) -> str | None:
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # builtins without introspection: nothing to check
        return None
    try:
        signature.bind(*([None] * num_arguments))
    except TypeError:
        return f"has the signature {getattr(factory, '__name__', 'factory')}{signature}"
    return None


def _tokenizer_problem(tokenizer) -> str | None:
    vocab_size, eos = tokenizer.vocab_size, tokenizer.eos_token_id
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 1:
        return f"returned a tokenizer whose vocab_size is {vocab_size!r} (needs an int >= 1)"
    if eos is not None and (not isinstance(eos, int) or isinstance(eos, bool)):
        return f"returned a tokenizer whose eos_token_id is {eos!r} (needs an int or None)"
    return None


def _is_pydantic_model(options: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(options, type) and issubclass(options, BaseModel)


def _describe(plugins, component) -> str:
    """``scheduler policy 'x' (plugin 'p', distribution d 1.0)``."""
    info = next((p for p in getattr(plugins, "plugins", []) if p.name == component.plugin), None)
    where = f"plugin '{component.plugin}'"
    if info is not None and info.distribution:
        where += f", distribution {info.distribution} {info.version or ''}".rstrip()
    return f"{component.seam.replace('_', ' ')} '{component.name}' ({where})"
