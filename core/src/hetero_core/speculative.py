"""What a speculative-decoding proposer author imports: the protocol, what ``propose`` gets, the
context a factory receives. See docs/hooks.md (``register_speculative_proposers``).

    from hetero_core import hookimpl
    from hetero_core.speculative import ProposalInput, ProposerContext

    class RepeatLast:
        def __init__(self, ctx: ProposerContext):
            pass

        def propose(self, inputs: list[ProposalInput]) -> list[list[int]]:
            return [[i.token_ids[-1]] * i.num_tokens for i in inputs]

        def release(self, seq_id: int) -> None:
            pass

        def shutdown(self) -> None:
            pass

    @hookimpl
    def register_speculative_proposers(register):
        register("repeat-last", RepeatLast)

Select it with ``speculative_proposer = "repeat-last"`` and ``num_speculative_tokens = 3``. Core's own
is ``ngram`` (prompt lookup). Test a proposer with ``hetero_core.testing.ProposerContract``.
"""

from hetero_core.engine.speculation.proposer import ProposalInput, Proposer, ProposerContext

# ``hookimpl`` is ``hetero_core.hookimpl``, kept here for the code that imported it from this facade
from hetero_core.plugin_system.hookspecs import hookimpl as hookimpl

__all__ = ["ProposalInput", "Proposer", "ProposerContext"]
