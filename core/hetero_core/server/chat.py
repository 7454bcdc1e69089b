"""POST /v1/chat/completions: messages through the tokenizer's chat template, streamed or not."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request

from hetero_core.openai_api.convert import chat_logprobs, usage
from hetero_core.server.body import parse_body
from hetero_core.server.errors import error_body, to_api_error
from hetero_core.server.generation import (
    EventStream,
    Generation,
    finish_reason,
    run_choices,
    sse,
)
from hetero_core.server.openapi import generation_route
from hetero_core.openai_api.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatMessageOut,
)
from hetero_core.server.state import ServerState, get_state

router = APIRouter()


@router.post("/v1/chat/completions",
             **generation_route(ChatCompletionRequest, ChatCompletionResponse, ChatCompletionChunk))
async def create_chat_completion(request: Request):
    body = await parse_body(request, ChatCompletionRequest)
    state = get_state(request)
    state.check_model(body.model)
    request_id = state.new_request_id("chatcmpl")
    messages = [m.as_dict() for m in body.messages]
    max_tokens = body.max_completion_tokens or body.max_tokens
    generation, _, results = await run_choices(request, state, body, request_id, [messages], max_tokens,
                                               body.num_logprobs)
    if results is None:
        return EventStream(_events(state, body, request_id, generation), generation)
    choices = [
        ChatChoice(index=i, message=ChatMessageOut(content=r.text), finish_reason=finish_reason(r.output),
                   logprobs=chat_logprobs(r.logprobs) if body.logprobs else None)
        for i, r in enumerate(results)
    ]
    return ChatCompletionResponse(id=request_id, model=state.model_name, choices=choices,
                                  usage=usage([r.output for r in results], body.n))


async def _events(state: ServerState, body: ChatCompletionRequest, request_id: str,
                  generation: Generation) -> AsyncIterator[str]:
    def chunk(choices, usage_=None) -> str:
        return sse(ChatCompletionChunk(id=request_id, model=state.model_name, choices=choices, usage=usage_))

    outputs: list = [None] * body.n
    try:
        for i in range(body.n):  # the role comes first, as OpenAI sends it
            yield chunk([ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))])
        async for i, delta in generation.deltas():
            outputs[i] = delta.output
            wants_logprobs = body.logprobs and delta.token_ids
            if delta.text or wants_logprobs:
                logprobs = chat_logprobs(delta.logprobs or []) if body.logprobs else None
                yield chunk([ChatChunkChoice(index=i, delta=ChatDelta(content=delta.text), logprobs=logprobs)])
            if delta.finished:
                yield chunk([ChatChunkChoice(index=i, delta=ChatDelta(), finish_reason=finish_reason(delta.output))])
        if body.include_usage:
            yield chunk([], usage(outputs, body.n))
    except Exception as exc:  # headers are sent: report the failure as an event
        error = to_api_error(exc)
        yield sse(json.dumps(error_body(error.message, error.type, error.param, error.code)))
    finally:
        await generation.aclose()
    yield sse("[DONE]")

