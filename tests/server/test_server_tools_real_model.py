"""The openai client's tool-calling example, unchanged, against the server on the embedded SmolLM2;
and a response_format json_schema answer that parses and validates."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("xgrammar", reason="structured output needs: pip install 'hetero-core[structured]'")

from hetero_core.builder import build_engine  # noqa: E402
from hetero_core.plugin_system.discovery import load_plugins  # noqa: E402
from hetero_core.settings import load_settings  # noqa: E402
from hetero_core.testing.structured_output_cases import SCHEMAS, schema_problems  # noqa: E402
from tests.server.live_server import LiveServer  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(smollm2_dir):
    settings = load_settings(model=str(smollm2_dir), executor="torch", max_num_blocks=256, temperature=0)
    with LiveServer(build_engine(settings, load_plugins(entry_points=[])), model_name="smollm2") as live:
        yield live.client()


TOOLS = [{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get current temperature for a given location.",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "City and country e.g. Bogotá, Colombia"}
                },
                "required": ["location"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    }]  # fmt: skip


def test_the_openai_tool_calling_example(client):
    # OpenAI's function-calling guide, as written there (tool_choice "auto": the model decides; the
    # 135M model answers in prose, which comes back as content).
    completion = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "What is the weather like in Paris today?"}],
        tools=TOOLS,
        max_tokens=60,
    )
    message = completion.choices[0].message
    assert message.tool_calls or message.content
    # The same with the call required: the structured-output seam makes the model write it.
    completion = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "What is the weather like in Paris today?"}],
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=60,
    )
    tool_call = completion.choices[0].message.tool_calls[0]
    args = json.loads(tool_call.function.arguments)
    assert tool_call.function.name == "get_weather" and args == {"location": "Paris"}
    assert completion.choices[0].finish_reason == "tool_calls"


def test_json_schema_on_smollm2(client):
    schema = SCHEMAS["enum and const"]
    result = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Pick a paint."}],
        max_tokens=100,
        response_format={"type": "json_schema", "json_schema": {"name": "paint", "schema": schema}},
    )
    assert not schema_problems(json.loads(result.choices[0].message.content), schema)


ADD = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


@pytest.mark.parametrize("stream", [False, True])
def test_required_with_parallel_calls_returns_the_add_call(client, stream):
    # issue 38: the model repeated the call until max_tokens and the answer had no calls.
    asked = dict(
        model="smollm2",
        messages=[{"role": "user", "content": "What is 2+3?"}],
        tools=ADD,
        tool_choice="required",
        max_tokens=60,
    )
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **asked))
        calls = [c for chunk in chunks for choice in chunk.choices for c in choice.delta.tool_calls or []]
        names = [c.function.name for c in calls if c.function and c.function.name]
        reason = [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason]
    else:
        message = client.chat.completions.create(**asked).choices[0]
        names, reason = [c.function.name for c in message.message.tool_calls], [message.finish_reason]
    assert names and set(names) == {"add"} and reason == ["tool_calls"]


def test_required_takes_a_tool_schema_with_defs(client):
    tool = {
        "type": "function",
        "function": {
            "name": "move",
            "parameters": {
                "type": "object",
                "properties": {"to": {"$ref": "#/$defs/Point"}},
                "required": ["to"],
                "$defs": {
                    "Point": {
                        "type": "object",
                        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                        "required": ["x", "y"],
                    }
                },
            },
        },
    }
    message = (
        client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "Move to 1, 2."}],
            tools=[tool],
            tool_choice="required",
            max_tokens=80,
        )
        .choices[0]
        .message
    )
    arguments = json.loads(message.tool_calls[0].function.arguments)
    assert set(arguments["to"]) == {"x", "y"}
