"""POST /v1/completions: text in, text out; streamed as server-sent events when asked. ``echo`` puts the
prompt (and its logprobs) before the answer, the first chunk's when streamed (``openai_api/echo.py``)."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request

from hetero_core.openai_api.convert import usage
from hetero_core.openai_api.echo import completion_choice, echo_usage
from hetero_core.openai_api.protocol import CompletionRequest, CompletionResponse
from hetero_core.server.body import parse_body
from hetero_core.server.errors import APIError, error_body, to_api_error
from hetero_core.server.generation import (
    ChoiceResult,
    EventStream,
    Generation,
    run_choices,
    sse,
)
from hetero_core.server.openapi import generation_route
from hetero_core.server.state import ServerState, get_state

router = APIRouter()


@router.post("/v1/completions", **generation_route(CompletionRequest, CompletionResponse, CompletionResponse))
async def create_completion(request: Request):
    body = await parse_body(request, CompletionRequest)
    state = get_state(request)
    state.check_model(body.model)
    best_of = body.best_of or body.n
    if best_of < body.n:
        raise APIError(400, f"best_of ({best_of}) must be at least n ({body.n})", param="best_of")
    if best_of > body.n and body.stream:
        raise APIError(
            400,
            "best_of above n cannot be streamed (the best n are known only when all best_of "
            "have finished); set stream to false, or best_of equal to n",
            param="best_of",
        )
    if body.echo_logprobs and (refusal := _prompt_logprobs_refusal(state)) is not None:
        raise APIError(
            400,
            "echo with logprobs lists the prompt's logprobs, which this executor cannot "
            f"give ({refusal}); leave logprobs out, or echo",
            param="echo",
        )
    ranks = best_of > body.n
    num_logprobs = 0 if ranks and body.logprobs is None else body.logprobs  # drawn to rank, shown if asked
    request_id = state.new_request_id("cmpl")
    generation, num_choices, results = await run_choices(
        request, state, body, request_id, body.prompts, body.engine_max_tokens, num_logprobs, best_of
    )
    if results is None:
        return EventStream(_events(state, body, request_id, generation, num_choices), generation)
    outputs = [r.output for r in results]  # usage counts every candidate's tokens, as OpenAI bills best_of
    if ranks:
        results = best_results(results, best_of, body.n)
    decode = _decoder(state)
    choices = [
        completion_choice(body, i, r.output, r.text, r.logprobs, True, True, decode)
        for i, r in enumerate(results)
    ]
    return CompletionResponse(
        id=request_id,
        model=state.model_name,
        choices=choices,
        usage=echo_usage(usage(outputs, best_of), body.generates),
    )


def _prompt_logprobs_refusal(state: ServerState) -> str | None:
    """Why the engine's executor cannot give prompt logprobs (None: it can)."""
    return getattr(getattr(state.llm.engine, "processor", None), "prompt_logprobs_refusal", None)


def _decoder(state: ServerState):
    return lambda token_id: state.llm.engine.tokenizer.decode([token_id])


def best_results(results: list[ChoiceResult], best_of: int, n: int) -> list[ChoiceResult]:
    """Of each prompt's ``best_of`` candidates (consecutive), the ``n`` of best cumulative logprob,
    best first."""

    def score(result: ChoiceResult) -> float:
        logprob = (
            result.output.outputs[0].cumulative_logprob if result.output and result.output.outputs else None
        )
        return -math.inf if logprob is None else logprob

    return [
        best
        for start in range(0, len(results), best_of)
        for best in sorted(results[start : start + best_of], key=score, reverse=True)[:n]
    ]


def _shifted(logprobs, offset: int):
    """A chunk's logprobs with its text offsets counted from the start of the choice's text."""
    logprobs.text_offset = [offset + o for o in logprobs.text_offset]
    return logprobs


async def _events(
    state: ServerState, body: CompletionRequest, request_id: str, generation: Generation, num_choices: int
) -> AsyncIterator[str]:
    outputs: list = [None] * num_choices
    offsets = [0] * num_choices
    started = [False] * num_choices  # a choice's first chunk carries the echoed prompt and prompt logprobs
    decode = _decoder(state)
    try:
        async for i, delta in generation.deltas():
            outputs[i] = delta.output
            choice = completion_choice(
                body,
                i,
                delta.output,
                delta.text,
                delta.logprobs or [],
                not started[i],
                delta.finished,
                decode,
            )
            wants_logprobs = choice.logprobs is not None and choice.logprobs.tokens
            if not (choice.text or delta.finished or wants_logprobs or choice.prompt_logprobs is not None):
                continue
            started[i] = True
            if choice.logprobs is not None:
                choice.logprobs = _shifted(choice.logprobs, offsets[i])
            offsets[i] += len(choice.text)
            yield sse(CompletionResponse(id=request_id, model=state.model_name, choices=[choice]))
        if body.include_usage:
            yield sse(
                CompletionResponse(
                    id=request_id,
                    model=state.model_name,
                    choices=[],
                    usage=echo_usage(usage(outputs, body.n), body.generates),
                )
            )
    except Exception as exc:  # headers are sent: report the failure as an event
        error = to_api_error(exc)
        yield sse(json.dumps(error_body(error.message, error.type, error.param, error.code)))
    finally:
        await generation.aclose()
    yield sse("[DONE]")
