"""Tool calls are never dropped: a cut ``required`` array keeps its whole calls, a repeated call is kept
once, streamed calls go out as each completes, and ``$defs``/``$ref`` resolve against the tool's schema."""

from __future__ import annotations

import json

import pytest

from hetero_core.openai_api.protocol import ChatCompletionRequest
from hetero_core.openai_api.tools import MAX_CALLS, answer, complete_calls, tool_call_schema
from hetero_core.server.tool_stream import ToolCallStream

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
POINT = {
    "type": "function",
    "function": {
        "name": "move",
        "parameters": {
            "type": "object",
            "properties": {"to": {"$ref": "#/$defs/Point"}},
            "required": ["to"],
            "$defs": {
                "Point": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
            },
        },
    },
}
CALL = '{"name": "add", "arguments": {"a": 2, "b": 3}}'


def body(**fields) -> ChatCompletionRequest:
    fields.setdefault("tools", [ADD])
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "What is 2+3?"}], **fields)


def test_a_cut_array_keeps_its_whole_calls_and_drops_repeats():
    cut = f'[{CALL}, {CALL}, {{"name": "add", "arguments": {{"a": 4, "b": 5}}}}, {{"name": "ad'
    assert [v["arguments"] for v in complete_calls(cut)[0]] == [{"a": 2, "b": 3}] * 2 + [{"a": 4, "b": 5}]
    content, calls = answer(cut, body(tool_choice="required"), "required")
    assert content is None
    assert [json.loads(c.arguments) for c in calls] == [{"a": 2, "b": 3}, {"a": 4, "b": 5}]
    assert answer('[{"name"', body(tool_choice="required"), "required") == (None, [])


def test_auto_keeps_an_unclosed_whole_block_and_drops_repeats():
    text = f"<tool_call>\n{CALL}\n</tool_call>\n<tool_call>\n{CALL}\n</tool_call>\n<tool_call>\n{CALL}"
    content, calls = answer(text, body(), "auto")
    assert content is None and [c.name for c in calls] == ["add"]


@pytest.mark.parametrize(
    "mode,pieces",
    [
        ("required", ["[", CALL[:20], CALL[20:], ", ", CALL, ", ", '{"name": "add", "argu']),
        ("auto", ["Sure. <tool", "_call>\n", CALL, "\n</tool_call>\n<tool_call>\n", CALL, "\n</tool_call>"]),
    ],
)
def test_a_streamed_call_goes_out_when_it_completes(mode, pieces):
    stream = ToolCallStream(body(tool_choice=mode), mode)
    sent_after = []
    for piece in pieces:
        stream.feed(piece)
        sent_after.append(stream.num_calls)
    assert 1 in sent_after and sent_after.index(1) <= 2 + (mode == "auto")  # before the output ends
    stream.finish()
    assert stream.num_calls == 1  # the repeat is not sent


def test_the_required_grammar_is_bounded_and_rebases_refs():
    schema = tool_call_schema(body(tools=[ADD, POINT]).tools, parallel=True)
    assert schema["maxItems"] == MAX_CALLS
    moved = schema["$defs"]["tool_1"]
    assert moved["properties"]["to"] == {"$ref": "#/$defs/tool_1/$defs/Point"}
    assert schema["items"]["anyOf"][1]["properties"]["arguments"] == {"$ref": "#/$defs/tool_1"}
    assert schema["items"]["anyOf"][0]["properties"]["arguments"] == ADD["function"]["parameters"]


def test_the_required_grammar_with_defs_compiles():
    xgrammar = pytest.importorskip("xgrammar")
    schema = tool_call_schema(body(tools=[ADD, POINT]).tools, parallel=True)
    xgrammar.Grammar.from_json_schema(json.dumps(schema))
