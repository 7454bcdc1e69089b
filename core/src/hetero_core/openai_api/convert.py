"""Between the API's bodies and the engine, without FastAPI: sampling parameters from a request
body, OpenAI's finish reasons, usage and logprobs from engine outputs. The server and batch files
(``hetero run --input-file``) both use these, so the two paths cannot disagree.
"""

from __future__ import annotations

from dataclasses import replace

from hetero_core.async_llm.request_stream import TokenLogprob
from hetero_core.engine.requests.outputs import RequestOutput
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.openai_api.guided import guided_decoding
from hetero_core.openai_api.protocol import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    SamplingFields,
    TopLogprob,
    Usage,
)


def sampling_params(
    body: SamplingFields, defaults: SamplingParams, max_tokens: int | None, logprobs: int | None
) -> SamplingParams:
    """The body's fields, with ``defaults`` for those it leaves out (None)."""
    d = defaults
    return SamplingParams(
        temperature=d.temperature if body.temperature is None else body.temperature,
        top_p=d.top_p if body.top_p is None else body.top_p,
        top_k=d.top_k if body.top_k is None else body.top_k,
        min_p=d.min_p if body.min_p is None else body.min_p,
        repetition_penalty=d.repetition_penalty
        if body.repetition_penalty is None
        else body.repetition_penalty,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        max_tokens=d.max_tokens if max_tokens is None else max_tokens,
        stop=tuple(body.stop or ()),
        ignore_eos=body.ignore_eos,
        logprobs=logprobs,
        seed=d.seed if body.seed is None else body.seed,
        guided_decoding=guided_decoding(body),
        **body.sampling_extras(),
    )


def choice_params(base: SamplingParams, choice: int) -> SamplingParams:
    """Choice i > 0 of a seeded request gets seed + i (distinct, reproducible)."""
    return replace(base, seed=base.seed + choice) if choice and base.seed is not None else base


def finish_reason(output: RequestOutput) -> str | None:
    """The engine's reason in OpenAI's words (eos and stop strings are both "stop")."""
    reason = output.finish_reason
    return "stop" if reason in ("eos", "stop") else reason


def usage(outputs: list, n: int) -> Usage:
    """Real token counts: each prompt once, every choice's generated tokens."""
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs[::n] if o is not None)
    completion_tokens = sum(len(o.output_token_ids) for o in outputs if o is not None)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def completion_logprobs(entries: list[TokenLogprob], text_offset: int = 0) -> CompletionLogprobs:
    """The legacy completions shape: parallel lists; ``text_offset`` of the first token in the text."""
    result = CompletionLogprobs()
    for entry in entries:
        result.tokens.append(entry.token)
        result.token_logprobs.append(entry.logprob)
        result.top_logprobs.append(dict(entry.top) if entry.logprob is not None else None)
        result.text_offset.append(text_offset)
        text_offset += len(entry.token)
    return result


def chat_logprobs(entries: list[TokenLogprob]) -> ChatLogprobs:
    """The chat shape: one object per token with its bytes and its top alternatives."""
    return ChatLogprobs(
        content=[
            ChatTokenLogprob(
                token=e.token,
                logprob=e.logprob,
                bytes=list(e.token.encode("utf-8")),
                top_logprobs=[
                    TopLogprob(token=t, logprob=v, bytes=list(t.encode("utf-8"))) for t, v in e.top
                ],
            )
            for e in entries
        ]
    )


def prompt_logprobs_out(output, k: int | None = None) -> list | None:
    """A ``RequestOutput``'s ``prompt_logprobs`` as vLLM's server writes them (token ids as keys),
    or None when its request asked for none; ``k``: keep the prompt token and the top ``k`` only (the
    engine ran more, for a completion's ``echo`` with a larger ``logprobs``)."""
    entries = getattr(output, "prompt_logprobs", None)
    if entries is None:
        return None
    return [
        None
        if entry is None
        else {
            str(t): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token}
            for i, (t, lp) in enumerate(entry.items())
            if k is None or i == 0 or (lp.rank or 0) <= k
        }
        for entry in entries
    ]
