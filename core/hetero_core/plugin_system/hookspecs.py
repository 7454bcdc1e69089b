"""The seams of Hetero, and the command line, as pluggy hook specifications.

Every seam hook receives ``register``; call it once per component. Components are selected by name
from settings, so registration order never matters. Core's own defaults use these same hooks. Plugin
authors import ``hookimpl`` from their seam's facade (``hetero_core.executor``, ``hetero_core.policy``,
...), not from here. A hook implementation whose name is not one of these fails its plugin.
``register_commands`` adds subcommands to ``hetero`` (simonw/llm's hook of the same name).
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
    """Call register(name, factory, options=Model, **traits) per executor; factory(ExecutorContext)."""


@hookspec
def register_structured_output_backends(register):
    """Call register(name, factory, options=Model) per structured-output backend; factory(StructuredOutputContext)."""


@hookspec
def register_speculative_proposers(register):
    """Call register(name, factory, options=Model) per speculative-decoding proposer; factory(ProposerContext)."""


@hookspec
def register_commands(commands):
    """Call commands.add_parser(name, ...) per ``hetero`` subcommand; set_defaults(handler=fn), fn(args) -> status."""
