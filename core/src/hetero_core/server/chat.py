"""POST /v1/chat/completions: messages through the tokenizer's chat template, streamed or not."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request

from hetero_core.openai_api.chat_prompt import chat_prompt
from hetero_core.openai_api.convert import chat_logprobs, prompt_logprobs_out, usage
from hetero_core.openai_api.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatMessageOut,
)
from hetero_core.openai_api.tools import answer, tool_call_out, tool_mode, with_tool_grammar
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
from hetero_core.server.state import ServerState, get_state
from hetero_core.server.tool_stream import ToolCallStream

router = APIRouter()


@router.post(
    "/v1/chat/completions",
    **generation_route(ChatCompletionRequest, ChatCompletionResponse, ChatCompletionChunk),
)
async def create_chat_completion(request: Request):
    body = await parse_body(request, ChatCompletionRequest)
    state = get_state(request)
    state.check_model(body.model)
    request_id = state.new_request_id("chatcmpl")
    mode = tool_mode(body)
    prompt = await asyncio.to_thread(chat_prompt, body, mode, getattr(state.llm.engine, "tokenizer", None))
    body = with_tool_grammar(body, mode)
    max_tokens = body.max_completion_tokens or body.max_tokens
    generation, _, results = await run_choices(
        request, state, body, request_id, [prompt], max_tokens, body.num_logprobs
    )
    if results is None:
        return EventStream(_events(state, body, request_id, generation, mode), generation)
    choices = []
    for i, r in enumerate(results):
        content, calls = answer(r.text, body, mode)
        message = ChatMessageOut(content=content, tool_calls=[tool_call_out(c) for c in calls])
        choices.append(
            ChatChoice(
                index=i,
                message=message,
                finish_reason="tool_calls" if calls else finish_reason(r.output),
                logprobs=chat_logprobs(r.logprobs) if body.logprobs else None,
            )
        )
    return ChatCompletionResponse(
        id=request_id,
        model=state.model_name,
        choices=choices,
        usage=usage([r.output for r in results], body.n),
        prompt_logprobs=prompt_logprobs_out(results[0].output) if results else None,
    )


async def _events(
    state: ServerState, body: ChatCompletionRequest, request_id: str, generation: Generation, mode: str | None
) -> AsyncIterator[str]:
    def chunk(choices, usage_=None) -> str:
        return sse(ChatCompletionChunk(id=request_id, model=state.model_name, choices=choices, usage=usage_))

    outputs: list = [None] * body.n
    tools = [ToolCallStream(body, mode) if mode else None for _ in range(body.n)]
    try:
        for i in range(body.n):  # the role comes first, as OpenAI sends it
            yield chunk([ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))])
        async for i, delta in generation.deltas():
            outputs[i] = delta.output
            wants_logprobs = body.logprobs and delta.token_ids
            if tools[i] is not None:
                for tool_delta in tools[i].feed(delta.text) + (tools[i].finish() if delta.finished else []):
                    yield chunk([ChatChunkChoice(index=i, delta=tool_delta)])
            elif delta.text or wants_logprobs:
                logprobs = chat_logprobs(delta.logprobs or []) if body.logprobs else None
                yield chunk(
                    [ChatChunkChoice(index=i, delta=ChatDelta(content=delta.text), logprobs=logprobs)]
                )
            if delta.finished:
                reason = (
                    "tool_calls"
                    if tools[i] is not None and tools[i].num_calls
                    else finish_reason(delta.output)
                )
                yield chunk([ChatChunkChoice(index=i, delta=ChatDelta(), finish_reason=reason)])
        if body.include_usage:
            yield chunk([], usage(outputs, body.n))
    except Exception as exc:  # headers are sent: report the failure as an event
        error = to_api_error(exc)
        yield sse(json.dumps(error_body(error.message, error.type, error.param, error.code)))
    finally:
        await generation.aclose()
    yield sse("[DONE]")
