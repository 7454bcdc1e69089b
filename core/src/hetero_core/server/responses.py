"""POST /v1/responses (OpenAI's Responses API) over the chat path, streamed or not; GET /v1/responses/{id}.

The request becomes a chat request (``openai_api/responses_convert.py``: instructions, input items,
function tools, ``text.format``, ``max_output_tokens``), prompted, generated and parsed for tool calls
as chat's are; the answer's text and calls come back as output items. With ``store`` (the default)
the response and its conversation are kept (``responses_store.py``) for ``previous_response_id``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request

from hetero_core.openai_api.chat_prompt import chat_prompt
from hetero_core.openai_api.convert import chat_logprobs, usage
from hetero_core.openai_api.protocol import ChatCompletionRequest, ChatDelta
from hetero_core.openai_api.responses_convert import (
    chat_request,
    input_messages,
    item_id,
    output_items,
    turns,
)
from hetero_core.openai_api.responses_output import Response, ResponseStreamEvent, ResponseUsage
from hetero_core.openai_api.responses_protocol import NamedFunctionChoice, ResponsesRequest
from hetero_core.openai_api.tools import answer, tool_mode, with_tool_grammar
from hetero_core.server.body import parse_body
from hetero_core.server.errors import to_api_error
from hetero_core.server.generation import EventStream, Generation, finish_reason, run_choices
from hetero_core.server.openapi import errors as error_statuses
from hetero_core.server.openapi import generation_route
from hetero_core.server.responses_store import ResponseStore, response_store
from hetero_core.server.responses_stream import ResponseEvents, finish_response
from hetero_core.server.state import get_state
from hetero_core.server.tool_stream import ToolCallStream

router = APIRouter()


@router.post("/v1/responses", **generation_route(ResponsesRequest, Response, ResponseStreamEvent))
async def create_response(request: Request):
    body = await parse_body(request, ResponsesRequest)
    state = get_state(request)
    state.check_model(body.model)
    store = response_store(request)
    history = (
        store.get(body.previous_response_id, "previous_response_id").conversation
        if body.previous_response_id
        else []
    )
    chat = chat_request(body, history)
    mode = tool_mode(chat)
    prompt = await asyncio.to_thread(chat_prompt, chat, mode, getattr(state.llm.engine, "tokenizer", None))
    chat = with_tool_grammar(chat, mode)
    response = _response(body, item_id("resp"), state.model_name)
    conversation = history + input_messages(body)
    generation, _, results = await run_choices(
        request, state, chat, response.id, [prompt], chat.max_tokens, chat.num_logprobs
    )
    if results is None:
        return EventStream(_events(body, chat, mode, response, generation, store, conversation), generation)
    [result] = results
    content, calls = answer(result.text, chat, mode)
    status = _status(calls, result.output)
    response.output = output_items(content, calls, status)
    if body.top_logprobs is not None and response.output and response.output[0].type == "message":
        response.output[0].content[0].logprobs = chat_logprobs(result.logprobs).content
    finish_response(response, status, _usage(result.output))
    _keep(body, store, response, conversation)
    return response


@router.get("/v1/responses/{response_id}", response_model=Response, responses=error_statuses(401, 404))
async def retrieve_response(response_id: str, request: Request) -> Response:
    return response_store(request).get(response_id).response


def _response(body: ResponsesRequest, response_id: str, model: str) -> Response:
    choice = body.tool_choice
    return Response(
        id=response_id,
        model=model,
        status="in_progress",
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        tools=[t.model_dump(exclude_none=True) for t in body.tools or []],
        tool_choice=choice.model_dump() if isinstance(choice, NamedFunctionChoice) else choice or "auto",
        parallel_tool_calls=body.parallel_tool_calls,
        text={"format": body.text.format.model_dump(by_alias=True, exclude_none=True)}
        if body.text and body.text.format
        else {"format": {"type": "text"}},
        previous_response_id=body.previous_response_id,
        store=body.store,
        metadata=body.metadata or {},
        user=body.user,
    )


def _usage(output) -> ResponseUsage:
    counts = usage([output], 1)
    return ResponseUsage(
        input_tokens=counts.prompt_tokens,
        output_tokens=counts.completion_tokens,
        total_tokens=counts.total_tokens,
    )


def _status(calls, output) -> str:
    """``incomplete`` when ``max_output_tokens`` cut a text answer."""
    return "incomplete" if not calls and finish_reason(output) == "length" else "completed"


def _keep(body: ResponsesRequest, store: ResponseStore, response: Response, conversation: list[dict]) -> None:
    if body.store:
        store.put(response, conversation + turns(response.output))


async def _events(
    body: ResponsesRequest,
    chat: ChatCompletionRequest,
    mode: str | None,
    response: Response,
    generation: Generation,
    store: ResponseStore,
    conversation: list[dict],
) -> AsyncIterator[str]:
    events = ResponseEvents(response)
    tools = ToolCallStream(chat, mode) if mode else None
    try:
        for event in events.start():
            yield event
        async for _, delta in generation.deltas():
            logprobs = (
                [entry.model_dump(mode="json") for entry in chat_logprobs(delta.logprobs or []).content]
                if body.top_logprobs is not None
                else None
            )
            if tools is not None:
                pieces = tools.feed(delta.text) + (tools.finish() if delta.finished else [])
            else:
                pieces = [ChatDelta(content=delta.text)] if delta.text else []
            for piece in pieces:
                for event in events.delta(piece, logprobs):
                    yield event
            if delta.finished:
                calls = tools is not None and tools.num_calls
                for event in events.finish(_status(calls, delta.output), _usage(delta.output)):
                    yield event
        _keep(body, store, response, conversation)
    except Exception as exc:  # headers are sent: report the failure as events
        error = to_api_error(exc)
        for event in events.fail(error.code or error.type, error.message, error.param):
            yield event
    finally:
        await generation.aclose()
