"""POST /v1/completions: text in, text out; streamed as server-sent events when asked."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request

from hetero_core.openai_api.convert import completion_logprobs, prompt_logprobs_out, usage
from hetero_core.server.body import parse_body
from hetero_core.server.errors import APIError, error_body, to_api_error
from hetero_core.server.generation import (
    EventStream,
    ChoiceResult,
    Generation,
    finish_reason,
    run_choices,
    sse,
)
from hetero_core.server.openapi import generation_route
from hetero_core.openai_api.protocol import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
)
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
        raise APIError(400, "best_of above n cannot be streamed (the best n are known only when all best_of "
                            "have finished); set stream to false, or best_of equal to n", param="best_of")
    ranks = best_of > body.n
    num_logprobs = 0 if ranks and body.logprobs is None else body.logprobs  # drawn to rank, shown if asked
    request_id = state.new_request_id("cmpl")
    generation, num_choices, results = await run_choices(request, state, body, request_id, body.prompts,
                                                         body.max_tokens, num_logprobs, best_of)
    if results is None:
        return EventStream(_events(state, body, request_id, generation, num_choices), generation)
    outputs = [r.output for r in results]  # usage counts every candidate's tokens, as OpenAI bills best_of
    if ranks:
        results = best_results(results, best_of, body.n)
    choices = [
        CompletionChoice(index=i, text=r.text, finish_reason=finish_reason(r.output),
                         logprobs=completion_logprobs(r.logprobs, 0) if body.logprobs is not None else None,
                         prompt_logprobs=prompt_logprobs_out(r.output))
        for i, r in enumerate(results)
    ]
    return CompletionResponse(id=request_id, model=state.model_name, choices=choices,
                              usage=usage(outputs, best_of))


def best_results(results: list[ChoiceResult], best_of: int, n: int) -> list[ChoiceResult]:
    """Of each prompt's ``best_of`` candidates (consecutive), the ``n`` of best cumulative logprob, best first."""
    def score(result: ChoiceResult) -> float:
        logprob = result.output.outputs[0].cumulative_logprob if result.output and result.output.outputs else None
        return -math.inf if logprob is None else logprob

    return [best for start in range(0, len(results), best_of)
            for best in sorted(results[start:start + best_of], key=score, reverse=True)[:n]]


async def _events(state: ServerState, body: CompletionRequest, request_id: str, generation: Generation,
                  num_choices: int) -> AsyncIterator[str]:
    outputs: list = [None] * num_choices
    offsets = [0] * num_choices
    prompt_sent = [body.prompt_logprobs is None] * num_choices  # vLLM sends them in a choice's first chunk
    try:
        async for i, delta in generation.deltas():
            outputs[i] = delta.output
            wants_logprobs = body.logprobs is not None and delta.token_ids
            if not (delta.text or delta.finished or wants_logprobs):
                continue
            choice = CompletionChoice(
                index=i, text=delta.text, finish_reason=finish_reason(delta.output) if delta.finished else None,
                logprobs=completion_logprobs(delta.logprobs or [], offsets[i]) if body.logprobs is not None else None,
                prompt_logprobs=None if prompt_sent[i] else prompt_logprobs_out(delta.output),
            )
            prompt_sent[i] = prompt_sent[i] or choice.prompt_logprobs is not None
            offsets[i] += len(delta.text)
            yield sse(CompletionResponse(id=request_id, model=state.model_name, choices=[choice]))
        if body.include_usage:
            yield sse(CompletionResponse(id=request_id, model=state.model_name, choices=[],
                                         usage=usage(outputs, body.n)))
    except Exception as exc:  # headers are sent: report the failure as an event
        error = to_api_error(exc)
        yield sse(json.dumps(error_body(error.message, error.type, error.param, error.code)))
    finally:
        await generation.aclose()
    yield sse("[DONE]")

