"""The four seams of Hetero, as pluggy hook specifications.

Every hook receives ``register``; call it once per component. Components are selected by name from
settings, so registration order never matters. Core's own defaults use these same hooks.
"""

import pluggy

PROJECT = "hetero"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_tokenizers(register):
    """Call register(name, factory, options=Model) for each tokenizer; factory(TokenizerContext)."""


@hookspec
def register_scheduler_policies(register):
    """Call register(name, factory, options=Model) for each scheduler policy; factory(options)."""


@hookspec
def register_kv_allocators(register):
    """Call register(name, factory, options=Model) per KV allocator; factory(num_blocks, block_size, options)."""


@hookspec
def register_executors(register):
    """Call register(name, factory, options=Model, needs_model=bool) per executor; factory(ExecutorContext)."""
