"""The ``ngram`` proposer (prompt lookup): no model, proposes what followed the sequence's last tokens
the last time they occurred in it.

For n from ``prompt_lookup_max`` down to ``prompt_lookup_min``, it looks for the latest earlier
occurrence of the sequence's last n tokens; the first n that matches proposes the tokens that
followed that occurrence, ``num_tokens`` of them (an occurrence near the end is a short-period
repeat: the proposal continues it). No match: no proposal. Pays when the output repeats its input (editing, summarising, code, extraction) and
costs a lookup per decoding sequence per step otherwise. Stateless: ``release`` has nothing to drop.

The lookup is ``bytes.rfind`` over the tokens packed as 32-bit words (C speed, no Python loop per
token); a hit that does not start on a word boundary is skipped.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from hetero_core.default_plugins.ngram_options import NgramOptions
from hetero_core.engine.proposer import ProposalInput, ProposerContext

__all__ = ["NgramProposer", "propose_ngram"]
WORD = 4  # bytes per packed token id


class NgramProposer:
    def __init__(self, ctx: ProposerContext) -> None:
        options = ctx.options if ctx.options is not None else NgramOptions()
        self.min_n, self.max_n = options.prompt_lookup_min, options.prompt_lookup_max

    def propose(self, inputs: list[ProposalInput]) -> list[list[int]]:
        return [propose_ngram(i.token_ids, i.num_tokens, self.min_n, self.max_n) for i in inputs]

    def release(self, seq_id: int) -> None:
        pass

    def shutdown(self) -> None:
        pass


def propose_ngram(token_ids: Sequence[int], num_tokens: int, min_n: int, max_n: int) -> list[int]:
    """What followed the latest earlier occurrence of the longest suffix of ``token_ids`` of length
    ``min_n..max_n``: ``num_tokens`` ids, [] if no suffix recurs. An occurrence that ends within
    ``num_tokens`` of the end is a repeat with a short period (``a b a b a b``, ``x x x x``): what
    followed it runs into the suffix, and the proposal continues the repeat (LZ77's overlapping copy)."""
    length = len(token_ids)
    if num_tokens < 1 or length < min_n + 1:
        return []
    data = array("i", token_ids).tobytes() if not isinstance(token_ids, array) else token_ids.tobytes()
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        needle = data[(length - n) * WORD:]
        end = (length - 1) * WORD  # the occurrence must end before the last token (not the suffix itself)
        while end >= len(needle):
            index = data.rfind(needle, 0, end)
            if index < 0:
                break
            if index % WORD == 0:
                start = index // WORD + n
                proposal = list(token_ids[start:start + num_tokens])
                period = length - start  # the match repeats with this period: continue the repeat
                while len(proposal) < num_tokens:
                    proposal.append(proposal[len(proposal) - period])
                return proposal
            end = index + len(needle) - 1  # an unaligned hit: look further left
    return []
