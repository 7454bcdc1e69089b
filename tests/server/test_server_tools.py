"""Tool calling with the openai client: tools / tool_choice (auto, required, a named function), the
Hermes <tool_call> parser, streamed tool_calls deltas, and a whole round trip (mock executor; the
grammar of required and named calls comes from the structured-output seam)."""

from __future__ import annotations

import json

import httpx
import pytest

from hetero_core.openai_api.tools import parse_tool_calls

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a given location",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "maxLength": 12},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                                           "required": ["zone"], "additionalProperties": False}}},
]  # fmt: skip
MESSAGES = [{"role": "user", "content": "What's the weather like in Paris today?"}]
CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}'
    "\n</tool_call>"
)


def test_parse_hermes_tool_calls():
    content, calls = parse_tool_calls("Let me check.\n" + CALL + CALL.replace("Paris", "Rome"))
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)["location"]) for c in calls] == [
        ("get_weather", "Paris"),
        ("get_weather", "Rome"),
    ]
    assert parse_tool_calls("no calls here") == ("no calls here", [])
    assert parse_tool_calls("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])


def check_weather_call(call) -> None:
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"location", "unit"} and arguments["unit"] in ("celsius", "fahrenheit")


needs_xgrammar = pytest.mark.skipif(
    not __import__("importlib").util.find_spec("xgrammar"),
    reason="required and named tool choice need: pip install 'hetero-core[structured]'",
)


@needs_xgrammar
def test_named_and_required_tool_choice_are_enforced(mock_server):
    client = mock_server(max_model_len=4096).client()
    named = {"type": "function", "function": {"name": "get_weather"}}
    result = client.chat.completions.create(
        model="test-model", messages=MESSAGES, tools=TOOLS, tool_choice=named, max_tokens=500
    )
    message = result.choices[0].message
    assert message.content is None and result.choices[0].finish_reason == "tool_calls"
    check_weather_call(message.tool_calls[0])
    result = client.chat.completions.create(
        model="test-model",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=1500,
        parallel_tool_calls=False,
    )
    [call] = result.choices[0].message.tool_calls
    assert call.function.name in ("get_weather", "get_time") and json.loads(call.function.arguments)


@needs_xgrammar
def test_auto_parses_the_models_tool_call_and_the_round_trip_continues(mock_server):
    client = mock_server(max_model_len=4096).client()
    forced = {"guided_regex": CALL.replace("{", r"\{").replace("}", r"\}")}  # the mock "decides" to call
    result = client.chat.completions.create(
        model="test-model", messages=MESSAGES, tools=TOOLS, max_tokens=200, extra_body=forced
    )
    message = result.choices[0].message
    assert result.choices[0].finish_reason == "tool_calls" and message.content is None
    check_weather_call(message.tool_calls[0])
    follow_up = MESSAGES + [
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "18 C, sunny"},
    ]
    answer = client.chat.completions.create(model="test-model", messages=follow_up, tools=TOOLS, max_tokens=5)
    assert answer.choices[0].message.content and answer.choices[0].message.tool_calls == []


@needs_xgrammar
def test_streamed_tool_calls_arrive_as_openai_deltas(mock_server):
    client = mock_server(max_model_len=4096).client()
    named = {"type": "function", "function": {"name": "get_weather"}}
    for extra in (
        {"tool_choice": named},
        {"extra_body": {"guided_regex": CALL.replace("{", r"\{").replace("}", r"\}")}},
    ):
        chunks = list(
            client.chat.completions.create(
                model="test-model", messages=MESSAGES, tools=TOOLS, max_tokens=300, stream=True, **extra
            )
        )
        deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
        assert deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
        assert all(d.index == 0 and d.id is None for d in deltas[1:])
        arguments = json.loads("".join(d.function.arguments or "" for d in deltas))
        assert arguments["unit"] in ("celsius", "fahrenheit")
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
        assert not any(c.choices[0].delta.content for c in chunks if c.choices)


@pytest.mark.parametrize("body, message", [
    ({"tool_choice": "required"}, "tool_choice needs tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice names function 'nope', which is not in tools; available: get_weather, get_time"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "already fixes the output's format"),
])  # fmt: skip
def test_bad_tool_requests_are_400s(mock_server, body, message):
    server = mock_server()
    response = httpx.post(
        server.base_url + "/v1/chat/completions",
        timeout=30,
        json={"messages": MESSAGES, "max_tokens": 5, **body},
    )
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]
