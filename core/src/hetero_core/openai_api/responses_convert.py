"""A Responses request as the chat request the chat path serves, and the chat answer back as output items.

The messages: ``instructions`` as the system message, then the earlier turns (``previous_response_id``'s,
given by the caller), then the input items; an assistant's ``function_call`` items join that assistant's
message as its ``tool_calls``, a ``function_call_output`` becomes a ``tool`` message. Function tools, the
tool choice, ``text.format`` (as ``response_format``), ``max_output_tokens`` (as ``max_tokens``) and the
sampling fields map one to one.
"""

from __future__ import annotations

import uuid

from pydantic import ValidationError

from hetero_core.errors import InvalidRequestError
from hetero_core.openai_api.extras import SamplingExtras
from hetero_core.openai_api.protocol import ChatCompletionRequest
from hetero_core.openai_api.responses_output import FunctionCallOutput, OutputMessage, OutputText
from hetero_core.openai_api.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ResponsesRequest,
)
from hetero_core.openai_api.tools import Call

SAMPLING = ("temperature", "top_p", "top_k", "seed", "parallel_tool_calls", "user")


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def input_messages(body: ResponsesRequest) -> list[dict]:
    """The request's own turns (not its instructions) as chat messages."""
    messages: list[dict] = []
    for item in body.input:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.text})
        elif isinstance(item, FunctionCallItem):
            _add_call(messages, item)
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text})
    return messages


def chat_request(body: ResponsesRequest, history: list[dict]) -> ChatCompletionRequest:
    """The chat request that answers ``body``, after the ``history`` turns of its previous response."""
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    fields = {name: getattr(body, name) for name in SAMPLING}
    fields.update(body.model_dump(include=set(SamplingExtras.model_fields)))
    if body.tools:
        fields["tools"] = [
            {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
            for t in body.tools
        ]
    choice = body.tool_choice
    if choice is not None:
        fields["tool_choice"] = (
            choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice.name}}
        )
    fmt = body.text.format if body.text else None
    if fmt is not None and fmt.type == "json_schema" and fmt.schema_ is None:
        raise InvalidRequestError(
            "text.format of type json_schema needs its schema (a JSON schema) in 'schema'"
        )
    if fmt is not None and fmt.type != "text":
        schema = {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}
        fields["response_format"] = (
            {"type": fmt.type}
            if fmt.type == "json_object"
            else {"type": "json_schema", "json_schema": schema}
        )
    if body.top_logprobs is not None:
        fields.update(logprobs=True, top_logprobs=body.top_logprobs)
    messages = system + history + input_messages(body)
    if not messages:
        raise InvalidRequestError("input holds no message: give a string or at least one message item")
    try:
        return ChatCompletionRequest.model_validate(
            {**fields, "messages": messages, "stream": body.stream, "max_tokens": body.max_output_tokens}
        )
    except ValidationError as exc:  # a turn the chat path cannot take (a field this module maps wrong)
        raise InvalidRequestError(
            f"the request cannot be served as a chat: {exc.errors()[0]['msg']}"
        ) from None


def output_items(content: str | None, calls: list[Call], status: str = "completed") -> list:
    """A finished answer's items: its text as an assistant message (if any), then one item per call."""
    items: list = []
    if content:
        items.append(OutputMessage(id=item_id("msg"), status=status, content=[OutputText(text=content)]))
    items += [
        FunctionCallOutput(id=item_id("fc"), call_id=c.id, name=c.name, arguments=c.arguments) for c in calls
    ]
    return items


def turns(items: list) -> list[dict]:
    """Output items as chat messages (what a later ``previous_response_id`` request continues from)."""
    messages: list[dict] = []
    for item in items:
        if isinstance(item, OutputMessage):
            messages.append({"role": "assistant", "content": "".join(p.text for p in item.content)})
        else:
            _add_call(messages, item)
    return messages


def _add_call(messages: list[dict], item) -> None:
    """A function call joins the assistant turn before it (or opens one) as one of its tool calls."""
    call = {
        "id": item.call_id,
        "type": "function",
        "function": {"name": item.name, "arguments": item.arguments},
    }
    if not (messages and messages[-1]["role"] == "assistant"):
        messages.append({"role": "assistant", "content": None})
    messages[-1].setdefault("tool_calls", []).append(call)
