"""The end of a step that verified proposals (speculative decoding): the plain path with k tokens.

Each sampled sequence of such a step got a list of tokens (``spec_verify``): the proposals the target
kept and one token of its own. Its computed length is set back by the rejected proposals first (their
K/V slots stay in its blocks and are written again by the next steps; only K/V of kept tokens is ever
named in the prefix cache), then the tokens are appended one at a time through the plain path's
checks (``Postprocessor.accept``: EOS, stop ids, stop strings, ``max_tokens``, ``max_model_len``): a
stop inside a kept run ends the request there and drops the rest. While tokens are appended the
computed length never passes the tokens known, so a request finished mid-run names only blocks of
tokens it has.
"""

from __future__ import annotations

from hetero_core.engine.requests.sequence import Sequence

__all__ = ["append_verified"]


def append_verified(
    postprocessor,
    seq: Sequence,
    token_ids: list[int],
    logprobs,
    spec: tuple[int, ...],
    same_kv: bool,
    eos_token_id: int | None,
) -> None:
    """Append ``seq``'s kept proposals and the target's token (``token_ids``) after its ``spec`` proposals
    ran; ``same_kv``: not preempted since it was scheduled (its K/V and computed length stand).
    ``postprocessor``: the ``Postprocessor`` whose ``accept`` checks each token."""
    valid_end = None  # the computed length to hold the appended tokens under (rolled back)
    if spec:
        num_kept = len(token_ids) - 1
        postprocessor.state.speculation.record(len(spec), num_kept)
        if same_kv:
            seq.num_computed_tokens -= len(spec) - num_kept  # the rejected proposals
            valid_end = seq.num_computed_tokens
    for token_id in token_ids:
        seq.output_token_ids.append(token_id)
        if valid_end is not None:
            seq.num_computed_tokens = min(valid_end, seq.num_tokens)
        postprocessor.accept(seq, token_id, logprobs, eos_token_id)
        if seq.status.is_done:
            break
