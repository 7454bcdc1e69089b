"""Tool calling in chat completions, Hermes style (the format SmolLM2 and Qwen templates use).

The prompt: the tools are listed in the system message inside ``<tools></tools>`` with the
instruction to answer ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; an assistant's
earlier calls are rendered the same way and a tool's answer as a user turn in ``<tool_response>``.
The answer: with ``tool_choice = "auto"`` the model writes free text, and ``parse_tool_calls`` takes
the ``<tool_call>`` blocks out of it; ``"required"`` and a named function are enforced with the
structured-output seam (``tool_guided_decoding``): the model can only write the calls, as JSON
(an array of ``{"name", "arguments"}``, or the named function's arguments), which ``calls_from_json``
reads; ``"none"`` leaves the tools out of the prompt.

No work is dropped: an answer cut by ``max_tokens`` keeps every call it completed (``complete_calls``
reads the whole elements of a cut array; ``auto`` takes a last, unclosed ``<tool_call>`` block whose
JSON is whole). With ``parallel_tool_calls`` the ``required`` grammar allows at most ``MAX_CALLS``
calls, and a call repeated with the same name and arguments is kept once (small models repeat a call
until the token limit). A tool's ``$defs`` / ``$ref`` are resolved against its own parameters schema
(``required`` nests the schemas in one array grammar: ``tool_call_schema``).
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
MAX_CALLS = 8  # tool_choice "required" with parallel_tool_calls: the grammar closes the array after this many
_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CLOSE) + r"|$)", re.S)
SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}'
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
            raise InvalidRequestError(
                "tool_choice needs tools: give the functions the model may call in 'tools'"
            )
        return None
    if choice == "none":
        return None
    if isinstance(choice, NamedToolChoice):
        names = [t.function.name for t in body.tools]
        if choice.function.name not in names:
            raise InvalidRequestError(
                f"tool_choice names function '{choice.function.name}', which is not in "
                f"tools; available: {', '.join(names)}"
            )
        return "named"
    return choice or "auto"


def chat_messages(body: ChatCompletionRequest, mode: str | None) -> list[dict[str, str]]:
    """The messages as the chat template gets them, with the tools in the system message (Hermes)."""
    messages = [_render(m) for m in body.messages]
    if mode is None:
        return messages
    listed = "\n".join(
        json.dumps({"type": "function", "function": t.function.model_dump(exclude_none=True)})
        for t in body.tools
    )
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
        return GuidedDecodingParams(json=tool_call_schema(body.tools, body.parallel_tool_calls))
    return None


def tool_call_schema(tools, parallel: bool) -> dict:
    """The JSON schema of ``required``'s answer: an array of ``{"name", "arguments"}`` objects, one
    to ``MAX_CALLS`` long (one without ``parallel``). A tool whose parameters use ``$ref`` is put under
    the root's ``$defs`` with its references rewritten to point there, so ``#/$defs/...`` (pydantic's)
    and ``#`` mean what they mean in the tool's own schema."""
    defs, calls = {}, []
    for i, tool in enumerate(tools):
        parameters = _parameters(tool)
        if _has_ref(parameters):
            key = f"tool_{i}"
            defs[key] = _rebased(parameters, f"#/$defs/{key}")
            parameters = {"$ref": f"#/$defs/{key}"}
        properties = {"name": {"const": tool.function.name}, "arguments": parameters}
        calls.append(
            {
                "type": "object",
                "properties": properties,
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema = {
        "type": "array",
        "minItems": 1,
        "maxItems": MAX_CALLS if parallel else 1,
        "items": calls[0] if len(calls) == 1 else {"anyOf": calls},
    }
    if defs:
        schema["$defs"] = defs
    return schema


_DATA_KEYWORDS = ("const", "enum", "default", "examples")  # values here are data, not schemas


def _has_ref(schema) -> bool:
    if isinstance(schema, dict):
        return any(k == "$ref" or (k not in _DATA_KEYWORDS and _has_ref(v)) for k, v in schema.items())
    return isinstance(schema, list) and any(_has_ref(v) for v in schema)


def _rebased(schema, root: str):
    """``schema`` with each local ``$ref`` ("#", "#/...") made relative to ``root``."""
    if isinstance(schema, list):
        return [_rebased(v, root) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = root + value[1:]
        elif key in _DATA_KEYWORDS:
            out[key] = value
        else:
            out[key] = _rebased(value, root)
    return out


def _parameters(tool) -> dict:
    return tool.function.parameters or {"type": "object", "properties": {}}


def calls_from_json(text: str, body: ChatCompletionRequest, mode: str) -> list[Call]:
    """The calls of a guided answer (``required``: an array of calls, whole or cut, each distinct call
    once; ``named``: the arguments)."""
    if mode == "named":
        value = _loads(text)
        return (
            [Call(body.tool_choice.function.name, json.dumps(value), new_call_id())]
            if value is not None
            else []
        )
    return calls_of(complete_calls(text)[0])


def calls_of(values: list) -> list[Call]:
    """Calls from ``{"name", "arguments"}`` values, a repeat of an earlier call (same name and
    arguments) left out."""
    calls, seen = [], set()
    for value in values:
        if not (isinstance(value, dict) and isinstance(value.get("name"), str)):
            continue
        arguments = json.dumps(value.get("arguments", {}))
        if (value["name"], arguments) not in seen:
            seen.add((value["name"], arguments))
            calls.append(Call(value["name"], arguments, new_call_id()))
    return calls


def complete_calls(text: str) -> tuple[list, int]:
    """The whole elements at the start of a JSON array that may be cut (``[{..}, {..}, {"na``), and
    where the text after the last of them begins."""
    decoder, values = json.JSONDecoder(), []
    pos = _skip(text, 0)
    if not text.startswith("[", pos):
        return values, 0
    pos = end = pos + 1
    while True:
        pos = _skip(text, pos)
        try:
            value, pos = decoder.raw_decode(text, pos)
        except ValueError:
            return values, end
        values.append(value)
        end = pos
        pos = _skip(text, pos)
        if not text.startswith(",", pos):
            return values, end
        pos += 1


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def parse_tool_calls(text: str) -> tuple[str | None, list[Call]]:
    """Free text with ``<tool_call>`` blocks -> (the text around them, or None; the calls). A block that
    is not a JSON object with a name stays in the text; a repeated call (same name and arguments) is
    taken once; a last block the output cut before ``</tool_call>`` counts if its JSON is whole."""
    calls, kept, last = [], [], 0
    for match in _BLOCK.finditer(text):
        value = _loads(match.group(1))
        if not (isinstance(value, dict) and isinstance(value.get("name"), str)):
            continue
        arguments = json.dumps(value.get("arguments", value.get("parameters", {})))
        if all((c.name, c.arguments) != (value["name"], arguments) for c in calls):
            calls.append(Call(value["name"], arguments, new_call_id()))
        kept.append(text[last : match.start()])
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
        raise InvalidRequestError(
            f"tool_choice '{mode}' already fixes the output's format; leave out "
            "response_format and the guided_* fields"
        )
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
