"""The seams of Hetero, and the command line, as pluggy hook specifications.

Every seam hook receives ``register``; call it once per component. Components are selected by name
from settings, so registration order never matters. Core's own defaults use these same hooks. Plugin
authors mark their hooks with ``hetero_core.hookimpl`` (``from hetero_core import hookimpl``), not with
this module (the same object; the seam facades keep it too, for older imports). A hook implementation
whose name is not one of these fails its plugin.
``register_commands`` adds subcommands to ``hetero`` (simonw/llm's hook of the same name).
``register_model_architectures`` adds model architectures, chosen by a checkpoint's ``config.json``
rather than by settings (``hetero_core.architectures``).
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
    """Call register(name, factory, options=Model) per KV allocator; factory(num_blocks, block_size,
    options)."""


@hookspec
def register_executors(register):
    """Call register(name, factory, options=Model, **traits) per executor; factory(ExecutorContext)."""


@hookspec
def register_structured_output_backends(register):
    """Call register(name, factory, options=Model) per structured-output backend;
    factory(StructuredOutputContext)."""


@hookspec
def register_model_architectures(register):
    """Call register(hf_architecture_name, ModelArchitecture(...)) per model architecture
    (hetero_core.architectures)."""


@hookspec
def register_kv_connectors(register):
    """Call register(name, factory, options=Model) per KV connector; factory(KVConnectorContext)."""


@hookspec
def register_speculative_proposers(register):
    """Call register(name, factory, options=Model) per speculative-decoding proposer;
    factory(ProposerContext)."""


@hookspec
def register_commands(commands):
    """Call commands.add_parser(name, ...) per ``hetero`` subcommand; set_defaults(handler=fn),
    fn(args) -> status."""
