"""Structured output over HTTP with the openai client: response_format (json_object, json_schema) and
vLLM's guided_json / guided_regex / guided_choice extras (mock executor)."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from hetero_core.testing.structured_output_cases import SCHEMAS, schema_problems

pytest.importorskip("xgrammar", reason="structured output needs: pip install 'hetero-core[structured]'")
MESSAGES = [{"role": "user", "content": "Describe a person."}]


def test_response_format_json_schema_and_json_object(mock_server):
    client = mock_server(max_model_len=4096).client()
    for name, schema in SCHEMAS.items():
        result = client.chat.completions.create(
            model="test-model",
            messages=MESSAGES,
            max_tokens=3000,
            seed=1,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": schema, "strict": True},
            },
        )
        text = result.choices[0].message.content
        assert not schema_problems(json.loads(text), schema), (name, text)
        assert result.choices[0].finish_reason == "stop"
    result = client.chat.completions.create(
        model="test-model", messages=MESSAGES, max_tokens=3000, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(result.choices[0].message.content), dict)


def test_vllm_guided_extras_on_chat_and_completions(mock_server):
    client = mock_server(max_model_len=4096).client()
    out = client.completions.create(
        model="test-model", prompt="Pick", max_tokens=20, extra_body={"guided_choice": ["red", "green"]}
    )
    assert out.choices[0].text in ("red", "green")
    out = client.completions.create(
        model="test-model", prompt="Date", max_tokens=20, extra_body={"guided_regex": r"\d{4}-\d{2}-\d{2}"}
    )
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", out.choices[0].text)
    schema = SCHEMAS["enum and const"]
    out = client.chat.completions.create(
        model="test-model", messages=MESSAGES, max_tokens=500, extra_body={"guided_json": schema}
    )
    assert not schema_problems(json.loads(out.choices[0].message.content), schema)


def test_streamed_json_concatenates_to_valid_json(mock_server):
    client = mock_server(max_model_len=4096).client()
    schema = SCHEMAS["nested objects"]
    stream = client.chat.completions.create(
        model="test-model",
        messages=MESSAGES,
        max_tokens=3000,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert not schema_problems(json.loads(text), schema)


@pytest.mark.parametrize("body, message", [
    ({"guided_regex": "a+", "guided_choice": ["a"]}, "at most one of response_format"),
    ({"response_format": {"type": "json_schema"}}, "needs json_schema.schema"),
    ({"guided_regex": "(unclosed"}, "could not be compiled"),
    ({"guided_json": "{not json"}, "not valid JSON"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
])  # fmt: skip
def test_bad_structured_requests_are_400s_that_say_why(mock_server, body, message):
    server = mock_server()
    response = httpx.post(
        server.base_url + "/v1/chat/completions",
        timeout=30,
        json={"messages": MESSAGES, "max_tokens": 5, **body},
    )
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]


def test_the_openai_clients_parse_with_a_pydantic_model(mock_server):
    from typing import Literal

    from pydantic import BaseModel

    class Step(BaseModel):
        explanation: str
        output: str

    class Answer(BaseModel):  # nested models: the schema refers to $defs
        steps: list[Step]
        final_answer: Literal["yes", "no"]

    client = mock_server(max_model_len=4096).client()
    result = client.chat.completions.parse(
        model="test-model", messages=MESSAGES, response_format=Answer, max_tokens=3000
    )
    assert isinstance(result.choices[0].message.parsed, Answer)


def test_a_grammar_left_no_first_token_is_a_400_naming_the_fields(mock_server):
    server = mock_server(max_model_len=512)
    body = {"prompt": "x", "max_tokens": 5, "guided_choice": ["yes", "no"], "allowed_token_ids": [ord("m")]}
    response = httpx.post(server.base_url + "/v1/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "allowed_token_ids" in message and "guided_choice" in message and "executor" not in message
    chat = {
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 5,
        "response_format": {"type": "json_object"},
        "allowed_token_ids": [ord("a")],
    }
    response = httpx.post(server.base_url + "/v1/chat/completions", json=chat, timeout=30)
    assert response.status_code == 400, response.text
    assert "response_format json_object" in response.json()["error"]["message"]
