"""The seams of Hetero, in one table: everything else (settings fields, CLI flags, plugin hooks,
registry, builder checks) reads it, so a new seam is one row here plus its hook spec.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Seam:
    name: str  # settings field, registry key, settings section (``[executor.mock]``)
    label: str  # how messages name it ("unknown KV allocator 'x'")
    default: str  # the component used when settings name none
    hook: str  # the pluggy hook (``hookspecs.py``) through which plugins register components
    factory: str  # what a component's factory is called with (documentation and error messages)


SEAM_TABLE: tuple[Seam, ...] = (
    Seam("tokenizer", "tokenizer", "auto", "register_tokenizers", "factory(TokenizerContext)"),
    Seam("scheduler_policy", "scheduler policy", "fcfs", "register_scheduler_policies",
         "factory(options)"),
    Seam("kv_allocator", "KV allocator", "paged", "register_kv_allocators",
         "factory(num_blocks, block_size, options)"),
    Seam("executor", "executor", "torch", "register_executors", "factory(ExecutorContext)"),
)

SEAMS: tuple[str, ...] = tuple(seam.name for seam in SEAM_TABLE)
SEAM_BY_NAME: dict[str, Seam] = {seam.name: seam for seam in SEAM_TABLE}
