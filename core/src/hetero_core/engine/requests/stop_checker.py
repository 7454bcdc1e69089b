"""Stop conditions applied after each new token: EOS, stop token ids, stop strings, length.

Before ``min_tokens`` output tokens, EOS, stop ids and stop strings do not end a request (as in
vLLM; an executor that returns token ids itself, such as the mock, may still produce them). What
ended a request by a stop is kept in ``seq.stop_reason``: the stop token id or the stop string
(vLLM's ``CompletionOutput.stop_reason``; None for EOS and length).
"""

from __future__ import annotations

from hetero_core.engine.requests.sequence import FinishReason, Sequence


def check_stop_token(seq: Sequence, token_id: int, eos_token_id: int | None) -> FinishReason | None:
    """Checked before the token's text is added: EOS and stop ids end without text."""
    params = seq.params
    if seq.num_output_tokens < params.min_tokens:  # a stop within min_tokens does not end the request
        return None
    if not params.ignore_eos and eos_token_id is not None and token_id == eos_token_id:
        return FinishReason.EOS
    if token_id in params.stop_token_ids:
        seq.stop_reason = token_id
        return FinishReason.STOP
    return None


def check_stop_string(seq: Sequence, num_new_chars: int) -> FinishReason | None:
    """Look for a stop string in the text that the last token touched; truncate the output there."""
    stops = seq.params.stop
    if not stops or num_new_chars == 0 or seq.num_output_tokens <= seq.params.min_tokens:
        return None
    text = seq.output_text
    longest = max(len(s) for s in stops)
    window_start = max(0, len(text) - num_new_chars - longest + 1)
    best = None
    for stop in stops:
        index = text.find(stop, window_start)
        if index != -1 and (best is None or index < best[0]):
            best = (index, stop)
    if best is None:
        return None
    index, stop = best
    seq.stop_reason = stop
    seq.output_text = text[: index + len(stop)] if seq.params.include_stop_str_in_output else text[:index]
    return FinishReason.STOP


def check_length(seq: Sequence, max_model_len: int) -> FinishReason | None:
    if seq.num_output_tokens >= seq.params.max_tokens or seq.num_tokens >= max_model_len:
        return FinishReason.LENGTH
    return None
