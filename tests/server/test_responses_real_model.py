"""/v1/responses on the embedded SmolLM2 with the openai client: a greedy plain answer equals the greedy
chat answer (streamed and not), a text.format json_schema answer parses and validates, and a required
function call comes back as a function_call item."""

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
QUESTION = "What is the capital of France?"
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get current temperature for a given location.",
    "parameters": {
        "type": "object",
        "properties": {"location": {"type": "string"}},
        "required": ["location"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.fixture(scope="module")
def client(smollm2_dir):
    settings = load_settings(model=str(smollm2_dir), executor="torch", max_num_blocks=256, temperature=0)
    with LiveServer(build_engine(settings, load_plugins(entry_points=[])), model_name="smollm2") as live:
        yield live.client()


def test_plain_answer_equals_chat_streamed_and_not(client):
    chat = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": QUESTION}], max_tokens=16
    )
    result = client.responses.create(model="smollm2", input=QUESTION, max_output_tokens=16)
    with client.responses.stream(model="smollm2", input=QUESTION, max_output_tokens=16) as stream:
        streamed = stream.get_final_response()
    assert result.output_text == chat.choices[0].message.content == streamed.output_text
    assert "Paris" in result.output_text
    assert result.usage.input_tokens == chat.usage.prompt_tokens


def test_json_schema_and_a_required_call(client):
    schema = SCHEMAS["enum and const"]
    result = client.responses.create(
        model="smollm2",
        input="Pick a paint.",
        max_output_tokens=100,
        text={"format": {"type": "json_schema", "name": "paint", "schema": schema}},
    )
    assert not schema_problems(json.loads(result.output_text), schema)
    result = client.responses.create(
        model="smollm2",
        input="What is the weather like in Paris today?",
        tools=[TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=60,
    )
    [call] = [item for item in result.output if item.type == "function_call"]
    assert call.name == "get_weather" and "location" in json.loads(call.arguments)
