"""The seams of Hetero, in one table: everything else (settings fields, CLI flags, plugin hooks,
registry, builder checks) reads it, so a new seam is one row here plus its hook spec.

A seam also declares the traits its components may carry (``register(name, factory, needs_model=True)``):
``register()`` refuses a trait the seam does not declare, or a value of the wrong type, so a typo
(``needs_modle``) fails its plugin instead of being kept and never read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Trait:
    name: str
    kind: type  # the value must be an instance of this (``bool`` accepts True/False only, not 0/1)
    meaning: str  # one line, for error messages and docs/hooks.md

    def problem(self, value: object) -> str | None:
        """Why ``value`` is not a valid value of this trait, or None."""
        if isinstance(value, self.kind):
            return None
        wanted = {bool: "True or False", Callable: "a callable"}.get(self.kind, self.kind.__name__)
        return f"trait {self.name}={value!r} must be {wanted} ({self.meaning})"


@dataclass(frozen=True)
class Seam:
    name: str  # settings field, registry key, settings section (``[executor.mock]``)
    label: str  # how messages name it ("unknown KV allocator 'x'")
    default: str  # the component used when settings name none
    hook: str  # the pluggy hook (``hookspecs.py``) through which plugins register components
    factory: str  # what a component's factory is called with (documentation and error messages)
    traits: tuple[Trait, ...] = ()  # what ``register(name, factory, **traits)`` accepts for this seam
    facade: str = ""  # the module its plugin authors import (``hetero_core.<facade>``; docs/hooks.md's table)

    def trait(self, name: str) -> Trait | None:
        return next((t for t in self.traits if t.name == name), None)


EXECUTOR_TRAITS = (
    Trait("needs_model", bool, "core resolves the model directory first and passes it as ctx.model_dir"),
    Trait(
        "preflight",
        Callable,
        "called with the executor's options (its settings section), returns the reasons it cannot run here",
    ),
    Trait("tensor_parallel", bool, "the factory builds one rank of a tensor-parallel group"),
    Trait("pipeline_parallel", bool, "the factory builds one stage (its layers only) of a pipeline"),
)

SEAM_TABLE: tuple[Seam, ...] = (
    Seam(
        "tokenizer",
        "tokenizer",
        "auto",
        "register_tokenizers",
        "factory(TokenizerContext)",
        facade="hetero_core.tokenizer",
    ),
    Seam(
        "scheduler_policy",
        "scheduler policy",
        "fcfs",
        "register_scheduler_policies",
        "factory(options)",
        facade="hetero_core.policy",
    ),
    Seam(
        "kv_allocator",
        "KV allocator",
        "paged",
        "register_kv_allocators",
        "factory(num_blocks, block_size, options)",
        facade="hetero_core.kv",
    ),
    Seam(
        "executor",
        "executor",
        "torch",
        "register_executors",
        "factory(ExecutorContext)",
        EXECUTOR_TRAITS,
        facade="hetero_core.executor",
    ),
    Seam(
        "structured_output",
        "structured-output backend",
        "xgrammar",
        "register_structured_output_backends",
        "factory(StructuredOutputContext)",
        facade="hetero_core.structured_output",
    ),
    Seam(
        "kv_connector",
        "KV connector",
        "socket",
        "register_kv_connectors",
        "factory(KVConnectorContext)",
        facade="hetero_core.kv_transfer",
    ),
    Seam(
        "speculative_proposer",
        "speculative proposer",
        "ngram",
        "register_speculative_proposers",
        "factory(ProposerContext)",
        facade="hetero_core.speculative",
    ),
)

SEAMS: tuple[str, ...] = tuple(seam.name for seam in SEAM_TABLE)
SEAM_BY_NAME: dict[str, Seam] = {seam.name: seam for seam in SEAM_TABLE}
