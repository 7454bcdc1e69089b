"""Tool calling in chat completions, Hermes style (the format SmolLM2 and Qwen templates use).

The prompt: the tools are listed in the system message inside ``<tools></tools>`` with the
instruction to answer ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; an assistant's
earlier calls are rendered the same way and a tool's answer as a user turn in ``<tool_response>``.
The answer: with ``tool_choice = "auto"`` the model writes free text, and ``parse_tool_calls`` takes
the ``<tool_call>`` blocks out of it; ``"required"`` and a named function are enforced with the
structured-output seam (``tool_guided_decoding``): the model can only write the calls, as JSON
(an array of ``{"name", "arguments"}``, or the named function's arguments), which ``calls_from_json``
reads; ``"none"`` leaves the tools out of the prompt.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from hetero_core.engine.requests.guided import GuidedDecodingParams
from hetero_core.errors import InvalidRequestError
from hetero_core.openai_api.guided import guided_decoding
from hetero_core.openai_api.protocol import ChatCompletionRequest, ChatMessage
from hetero_core.openai_api.tool_protocol import FunctionCallOut, NamedToolChoice, ToolCallOut

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CLOSE) + r"|$)", re.S)
SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}"
    "\n</tool_call>"
)


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # JSON text
    id: str


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_mode(body: ChatCompletionRequest) -> str | None:
    """None (no tools), "auto", "required" or "named"; checks a named function exists."""
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none", "auto"):
            raise InvalidRequestError("tool_choice needs tools: give the functions the model may call in 'tools'")
        return None
    if choice == "none":
        return None
    if isinstance(choice, NamedToolChoice):
        names = [t.function.name for t in body.tools]
        if choice.function.name not in names:
            raise InvalidRequestError(f"tool_choice names function '{choice.function.name}', which is not in "
                                      f"tools; available: {', '.join(names)}")
        return "named"
    return choice or "auto"


def chat_messages(body: ChatCompletionRequest, mode: str | None) -> list[dict[str, str]]:
    """The messages as the chat template gets them, with the tools in the system message (Hermes)."""
    messages = [_render(m) for m in body.messages]
    if mode is None:
        return messages
    listed = "\n".join(json.dumps({"type": "function", "function": t.function.model_dump(exclude_none=True)})
                       for t in body.tools)
    system = SYSTEM.format(tools=listed)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + system}] + messages[1:]
    return [{"role": "system", "content": system}] + messages


def _render(message: ChatMessage) -> dict[str, str]:
    if message.role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{message.text}\n</tool_response>"}
    rendered = message.as_dict()
    for call in message.tool_calls or []:
        body = json.dumps({"name": call.function.name, "arguments": _loads(call.function.arguments)})
        rendered["content"] += ("\n" if rendered["content"] else "") + f"{OPEN}\n{body}\n{CLOSE}"
    return rendered


def tool_guided_decoding(body: ChatCompletionRequest, mode: str | None) -> GuidedDecodingParams | None:
    """The grammar that enforces ``required`` or a named function (None for ``auto`` and no tools)."""
    if mode == "named":
        [tool] = [t for t in body.tools if t.function.name == body.tool_choice.function.name]
        return GuidedDecodingParams(json=_parameters(tool))
    if mode == "required":
        calls = [{"type": "object", "properties": {"name": {"const": t.function.name}, "arguments": _parameters(t)},
                  "required": ["name", "arguments"], "additionalProperties": False} for t in body.tools]
        schema = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
        if not body.parallel_tool_calls:
            schema["maxItems"] = 1
        return GuidedDecodingParams(json=schema)
    return None


def _parameters(tool) -> dict:
    return tool.function.parameters or {"type": "object", "properties": {}}


def calls_from_json(text: str, body: ChatCompletionRequest, mode: str) -> list[Call]:
    """The calls of a guided answer (``required``: an array of calls; ``named``: the arguments)."""
    value = _loads(text)
    if mode == "named":
        return [Call(body.tool_choice.function.name, json.dumps(value), new_call_id())] if value is not None else []
    if not isinstance(value, list):
        return []
    return [Call(c["name"], json.dumps(c.get("arguments", {})), new_call_id())
            for c in value if isinstance(c, dict) and isinstance(c.get("name"), str)]


def parse_tool_calls(text: str) -> tuple[str | None, list[Call]]:
    """Free text with ``<tool_call>`` blocks -> (the text around them, or None; the calls). A block that
    is not a JSON object with a name stays in the text."""
    calls, kept, last = [], [], 0
    for match in _BLOCK.finditer(text):
        value = _loads(match.group(1))
        if not (isinstance(value, dict) and isinstance(value.get("name"), str)):
            continue
        arguments = value.get("arguments", value.get("parameters", {}))
        calls.append(Call(value["name"], json.dumps(arguments), new_call_id()))
        kept.append(text[last:match.start()])
        last = match.end()
    kept.append(text[last:])
    content = "".join(kept).strip() if calls else text
    return (content or None), calls


def _loads(text: str):
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


def with_tool_grammar(body: ChatCompletionRequest, mode: str | None) -> ChatCompletionRequest:
    """The body with ``required`` / named enforced as its ``guided_json`` (refused beside another format)."""
    guided = tool_guided_decoding(body, mode)
    if guided is None:
        return body
    if guided_decoding(body) is not None:
        raise InvalidRequestError(f"tool_choice '{mode}' already fixes the output's format; leave out "
                                  "response_format and the guided_* fields")
    return body.model_copy(update={"guided_json": json.loads(guided.json)})


def answer(text: str, body: ChatCompletionRequest, mode: str | None) -> tuple[str | None, list[Call]]:
    """A finished choice's (content, tool calls)."""
    if mode in ("named", "required"):
        return None, calls_from_json(text, body, mode)
    if mode == "auto":
        return auto_calls(text, body)
    return text, []


def auto_calls(text: str, body: ChatCompletionRequest) -> tuple[str | None, list[Call]]:
    """``tool_choice = "auto"``: the calls in free text; only the first with ``parallel_tool_calls`` false."""
    content, calls = parse_tool_calls(text)
    return content, calls if body.parallel_tool_calls else calls[:1]


def tool_call_out(call: Call) -> ToolCallOut:
    return ToolCallOut(id=call.id, function=FunctionCallOut(name=call.name, arguments=call.arguments))
