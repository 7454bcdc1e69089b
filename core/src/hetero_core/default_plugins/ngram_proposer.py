"""The ``ngram`` proposer (prompt lookup): no model, proposes what followed the sequence's last tokens
the last time they occurred in it.

For n from ``prompt_lookup_max`` down to ``prompt_lookup_min``, it looks for the latest earlier
occurrence of the sequence's last n tokens; the first n that matches proposes the tokens that
followed that occurrence, ``num_tokens`` of them (an occurrence near the end is a short-period
repeat: the proposal continues it). No match: no proposal. Pays when the output repeats its input
(editing, summarising, code, extraction) and costs a lookup per decoding sequence per step otherwise.

The lookup is ``bytes.rfind`` over the tokens packed as 32-bit words (C speed, no Python loop per
token); a hit that does not start on a word boundary is skipped. The packed tokens of each sequence
are kept between steps and extended by the new tokens only (a sequence only grows; ``release`` drops
them, and a sequence whose tokens no longer extend what was kept is packed again).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from hetero_core.default_plugins.ngram_options import NgramOptions
from hetero_core.engine.speculation.proposer import ProposalInput, ProposerContext

__all__ = ["NgramProposer", "propose_ngram"]
WORD = 4  # bytes per packed token id


class NgramProposer:
    def __init__(self, ctx: ProposerContext) -> None:
        options = ctx.options if ctx.options is not None else NgramOptions()
        self.min_n, self.max_n = options.prompt_lookup_min, options.prompt_lookup_max
        self._packed: dict[int, array] = {}  # seq_id -> its tokens so far, as 32-bit words

    def propose(self, inputs: list[ProposalInput]) -> list[list[int]]:
        return [
            propose_ngram(i.token_ids, i.num_tokens, self.min_n, self.max_n, self._pack(i)) for i in inputs
        ]

    def release(self, seq_id: int) -> None:
        self._packed.pop(seq_id, None)

    def shutdown(self) -> None:
        self._packed.clear()

    def _pack(self, given: ProposalInput) -> bytes:
        tokens, packed = given.token_ids, self._packed.get(given.seq_id)
        kept = 0 if packed is None else len(packed)
        stale = kept > len(tokens) or (kept and (packed[-1] != tokens[kept - 1] or packed[0] != tokens[0]))
        if (
            packed is None or stale
        ):  # new, or not a continuation of what was kept (a caller that did not release)
            packed = self._packed[given.seq_id] = array("i", tokens)
        elif kept < len(tokens):
            packed.extend(tokens[kept:])
        return packed.tobytes()


def propose_ngram(
    token_ids: Sequence[int], num_tokens: int, min_n: int, max_n: int, packed: bytes | None = None
) -> list[int]:
    """What followed the latest earlier occurrence of the longest suffix of ``token_ids`` of length
    ``min_n..max_n``: ``num_tokens`` ids, [] if no suffix recurs. An occurrence that ends within
    ``num_tokens`` of the end is a repeat with a short period (``a b a b a b``, ``x x x x``): what
    followed it runs into the suffix, and the proposal continues the repeat (LZ77's overlapping copy).
    ``packed``: the same tokens as 32-bit words, if the caller has them."""
    length = len(token_ids)
    if num_tokens < 1 or length < min_n + 1:
        return []
    data = packed if packed is not None else array("i", token_ids).tobytes()
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        needle = data[(length - n) * WORD :]
        end = (length - 1) * WORD  # the occurrence must end before the last token (not the suffix itself)
        while end >= len(needle):
            index = data.rfind(needle, 0, end)
            if index < 0:
                break
            if index % WORD == 0:
                start = index // WORD + n
                proposal = list(token_ids[start : start + num_tokens])
                period = length - start  # the match repeats with this period: continue the repeat
                while len(proposal) < num_tokens:
                    proposal.append(proposal[len(proposal) - period])
                return proposal
            end = index + len(needle) - 1  # an unaligned hit: look further left
    return []
