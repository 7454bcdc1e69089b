"""Completions' ``echo``: the prompt back before the answer, with its logprobs when ``logprobs`` is set,
as OpenAI's legacy API and vLLM give them (what lm-eval's ``local-completions`` scores with).

The text is the prompt's then the generated text; ``logprobs`` lists every prompt token then every
generated one: ``token_logprobs`` None for the first prompt token (nothing predicts it), and its
``top_logprobs`` None; a prompt token's ``top_logprobs`` hold the ``logprobs`` most likely tokens and the
prompt token itself (vLLM's shape). ``max_tokens`` 0 (only with echo) runs the prompt and keeps no
generated token: the engine runs one token (its ``max_tokens`` is at least 1) and it is dropped, as vLLM
does; ``finish_reason`` is "length" and ``completion_tokens`` 0. The server and batch files both use these.
"""

from __future__ import annotations

from hetero_core.async_llm.request_stream import TokenLogprob
from hetero_core.openai_api.convert import completion_logprobs, finish_reason, prompt_logprobs_out
from hetero_core.openai_api.protocol import CompletionChoice, CompletionRequest, Usage


def completion_choice(
    body: CompletionRequest,
    index: int,
    output,
    text: str,
    logprobs: list,
    first: bool,
    finished: bool,
    decode,
) -> CompletionChoice:
    """A choice of ``output`` (``text``, ``logprobs``: its generated ones), or a streamed choice's chunk
    (``first``: its first, which carries the echoed prompt and vLLM's ``prompt_logprobs``);
    ``decode(token_id)``: a token's text."""
    if not body.generates:
        text, logprobs = "", []
    if first and body.echo:
        text = output.prompt + text
        if body.logprobs is not None:
            logprobs = prompt_token_logprobs(output, body.logprobs, decode) + list(logprobs)
    reason = (finish_reason(output) if body.generates else "length") if finished else None
    shown = first and body.prompt_logprobs is not None  # vLLM's extra, as asked
    return CompletionChoice(
        index=index,
        text=text,
        finish_reason=reason,
        logprobs=completion_logprobs(logprobs, 0) if body.logprobs is not None else None,
        prompt_logprobs=prompt_logprobs_out(output, body.prompt_logprobs) if shown else None,
    )


def prompt_token_logprobs(output, k: int, decode) -> list[TokenLogprob]:
    """The prompt's tokens of ``output`` (a ``RequestOutput`` with ``prompt_logprobs``) as completion
    logprob entries; ``decode(token_id)``: a token's text (for the first, which has no entry)."""
    ids, entries = output.prompt_token_ids, output.prompt_logprobs or []
    result = []
    for position, token_id in enumerate(ids):
        entry = entries[position] if position < len(entries) else None
        if entry is None or token_id not in entry:
            result.append(TokenLogprob(token_id, decode(token_id), None))
            continue
        chosen = entry[token_id]
        top: dict[str, float] = {}
        for tid, lp in sorted(entry.items(), key=lambda item: item[1].rank or 0):
            if tid == token_id or (lp.rank is not None and lp.rank <= k):
                top.setdefault(lp.decoded_token if lp.decoded_token is not None else decode(tid), lp.logprob)
        token = chosen.decoded_token if chosen.decoded_token is not None else decode(token_id)
        result.append(TokenLogprob(token_id, token, chosen.logprob, list(top.items())))
    return result


def echo_usage(usage: Usage, generates: bool) -> Usage:
    """``usage`` with no completion tokens when ``max_tokens`` was 0 (the one token run is dropped)."""
    if generates:
        return usage
    return Usage(prompt_tokens=usage.prompt_tokens, completion_tokens=0, total_tokens=usage.prompt_tokens)
