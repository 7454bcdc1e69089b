"""A request whose token constraints leave its grammar no first token, refused before any engine work.

A guided request (``response_format``, ``guided_*``, ``tool_choice``) may also carry token-level
constraints: ``allowed_token_ids``, ``bad_words`` and ``min_tokens`` (which holds back EOS and
``stop_token_ids``); ``logit_bias`` never bans (its values lie in [-100, 100], as OpenAI's). When
they remove every token the grammar allows at its start, no step can ever sample the request's first
token. That is knowable at intake, where the grammar is compiled, for the price of one bitmask row:
this module intersects the grammar's start bitmask with the constraints, as the sampler would at the
first step, and names the fields.

It follows the sampler's rule (``Sampler._reconcile_grammar``): a grammar that is already complete at
its start (it allows EOS) is served with EOS even if the constraints ban it, so that is not refused.
Later positions depend on the tokens sampled; the sampler still checks them, step by step.
"""

from __future__ import annotations

from typing import Any

from hetero_core.engine.requests.params import SamplingParams
from hetero_core.engine.sampling.token_bitmask import allocate_token_bitmask, allowed_token_ids

# where a grammar of each kind comes from in a request: the python API's field, then the server's
GUIDED_FIELDS = {
    "json": "guided_decoding json (response_format json_schema, guided_json, tool_choice)",
    "json_object": "guided_decoding json_object (response_format json_object)",
    "regex": "guided_decoding regex (guided_regex)",
    "choice": "guided_decoding choice (guided_choice)",
    "grammar": "guided_decoding grammar (guided_grammar)",
}
SHOWN_IDS = 8  # the grammar's first tokens a message lists


def grammar_start_error(
    state: Any, params: SamplingParams, vocab_size: int, eos_token_id: int | None
) -> str | None:
    """Why ``params``' token constraints leave the grammar ``state`` (at its start) no first token, or
    None when some token is left (or the request has no token constraint to check)."""
    banning = _banning_fields(params)
    if not banning:
        return None
    bitmask = allocate_token_bitmask(1, vocab_size)
    state.fill_bitmask(bitmask, 0)
    grammar_ids = allowed_token_ids(bitmask[0], vocab_size)
    left = set(grammar_ids) - _banned_at_start(params, eos_token_id)
    if params.allowed_token_ids is not None:
        left &= set(params.allowed_token_ids)
    if left or (eos_token_id is not None and eos_token_id in grammar_ids):
        return None  # a token is left; or the grammar is complete and EOS ends the request at once
    kind = params.guided_decoding.kind
    shown = ", ".join(map(str, grammar_ids[:SHOWN_IDS])) + (", ..." if len(grammar_ids) > SHOWN_IDS else "")
    return (
        f"the request's {GUIDED_FIELDS[kind]} must start with one of {len(grammar_ids)} token(s) "
        f"[{shown}], and its {' / '.join(banning)} leave(s) none of them; allow a token the format "
        "starts with, or drop one of these fields"
    )


def _banning_fields(params: SamplingParams) -> list[str]:
    """The request's fields that can remove a first token."""
    fields = []
    if params.allowed_token_ids is not None:
        fields.append("allowed_token_ids")
    if any(len(word) == 1 for word in params.bad_words_token_ids):
        fields.append("bad_words")
    if params.min_tokens and params.stop_token_ids:  # EOS alone never refuses: a grammar that allows it
        fields.append("min_tokens")  # at its start is complete, and EOS is let through
    return fields


def _banned_at_start(params: SamplingParams, eos_token_id: int | None) -> set[int]:
    """The tokens the constraints ban at the first step (``logits_constraints``, with no output yet:
    only a bad word of one token can match)."""
    banned = {word[0] for word in params.bad_words_token_ids if len(word) == 1}
    if params.min_tokens:
        banned |= set(params.stop_token_ids)
        if eos_token_id is not None and not params.ignore_eos:
            banned.add(eos_token_id)
    return banned
