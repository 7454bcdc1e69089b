"""What a structured-output backend author imports: the request shape, the backend and grammar-state
protocols, the context a factory receives, the token-bitmask helpers. See docs/hooks.md
(``register_structured_output_backends``).

    from hetero_core import hookimpl
    from hetero_core.structured_output import StructuredOutputContext

    @hookimpl
    def register_structured_output_backends(register):
        register("my-grammar", lambda ctx: MyBackend(ctx.tokenizer, ctx.vocab_size))

Core's own backend is ``xgrammar`` (``pip install 'hetero-core[structured]'``). Test a backend with
``hetero_core.testing.StructuredOutputContract``. Importing this module imports no torch.
"""

from hetero_core.engine.requests.guided import GuidedDecodingParams
from hetero_core.engine.sampling.structured_output import (
    GrammarState,
    StructuredOutputBackend,
    StructuredOutputContext,
)
from hetero_core.engine.sampling.token_bitmask import allocate_token_bitmask, allowed_token_ids, num_words

# ``hookimpl`` is ``hetero_core.hookimpl``, kept here for the code that imported it from this facade
from hetero_core.plugin_system.hookspecs import hookimpl as hookimpl

__all__ = [
    "GrammarState",
    "GuidedDecodingParams",
    "StructuredOutputBackend",
    "StructuredOutputContext",
    "allocate_token_bitmask",
    "allowed_token_ids",
    "num_words",
]
