"""/v1/responses with the openai client's ``responses`` API against a live server (mock executor): plain
and item input, instructions, streaming events, function tools and their function_call_output round trip,
text.format json_schema, max_output_tokens, usage, the bounded store behind previous_response_id."""

from __future__ import annotations

import importlib.util
import json

import httpx
import openai
import pytest

from hetero_core.engine.requests.params import SamplingParams

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}},
            "required": ["city"],
            "additionalProperties": False,
        },
    }
]
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
    "required": ["answer", "n"],
    "additionalProperties": False,
}
needs_xgrammar = pytest.mark.skipif(
    not importlib.util.find_spec("xgrammar"),
    reason="guided output needs: pip install 'hetero-core[structured]'",
)


def offline_chat(make_mock_engine, messages, **params):
    [out] = make_mock_engine(None).generate([messages], SamplingParams(**params))
    return out


def test_create_with_string_input_matches_chat_and_counts_usage(mock_server, make_mock_engine):
    client = mock_server().client()
    result = client.responses.create(
        model="test-model",
        input="Hello there",
        instructions="Be brief.",
        max_output_tokens=9,
        temperature=0,
        store=False,
        metadata={"k": "v"},
    )
    expected = offline_chat(
        make_mock_engine,
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
        max_tokens=9,
        temperature=0,
    )
    assert result.object == "response" and result.id.startswith("resp_") and result.model == "test-model"
    assert result.output_text == expected.text and result.output[0].type == "message"
    assert result.status == "incomplete" and result.incomplete_details.reason == "max_output_tokens"
    assert result.usage.output_tokens == 9 and result.usage.input_tokens == len(expected.prompt_token_ids)
    assert result.usage.total_tokens == result.usage.input_tokens + 9
    assert result.instructions == "Be brief." and result.max_output_tokens == 9
    assert result.metadata == {"k": "v"}


def test_item_input_and_the_stream_concatenates_to_the_same_text(mock_server):
    client = mock_server().client()
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
        {"role": "user", "content": "More please"},
    ]
    whole = client.responses.create(input=items, max_output_tokens=12, temperature=0, extra_body={"seed": 1})
    with client.responses.stream(
        model="test-model", input=items, max_output_tokens=12, temperature=0, extra_body={"seed": 1}
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) >= 2 and "".join(deltas) == whole.output_text == final.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens == 12


@needs_xgrammar
def test_function_tool_round_trip_and_streamed_call(mock_server):
    client = mock_server(max_model_len=4096).client()
    first = client.responses.create(
        input="Weather in Paris?",
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=1500,
    )
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and "city" in json.loads(call.arguments)
    assert call.call_id.startswith("call_")
    second = client.responses.create(
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ],
        tools=TOOLS,
        max_output_tokens=8,
    )
    assert second.status in ("completed", "incomplete") and second.output
    named = {"type": "function", "name": "get_weather"}
    with client.responses.stream(
        model="test-model", input="Weather?", tools=TOOLS, tool_choice=named, max_output_tokens=500
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done.arguments == arguments and "city" in json.loads(arguments)
    assert final.output[0].type == "function_call" and final.output[0].arguments == arguments


@needs_xgrammar
def test_text_format_json_schema_is_enforced_streamed_and_not(mock_server):
    client = mock_server(max_model_len=4096).client()
    text = {"format": {"type": "json_schema", "name": "reply", "schema": SCHEMA, "strict": True}}
    result = client.responses.create(input="Answer in JSON", text=text, max_output_tokens=200)
    value = json.loads(result.output_text)
    assert set(value) == {"answer", "n"} and isinstance(value["n"], int)
    with client.responses.stream(
        model="test-model", input="Answer in JSON", text=text, max_output_tokens=200
    ) as stream:
        final = stream.get_final_response()
    assert set(json.loads(final.output_text)) == {"answer", "n"}


def test_previous_response_id_continues_from_the_store_and_get_retrieves(mock_server):
    client = mock_server().client()
    first = client.responses.create(input="Hi", max_output_tokens=4)
    assert client.responses.retrieve(first.id).output_text == first.output_text
    second = client.responses.create(input="And then?", previous_response_id=first.id, max_output_tokens=4)
    alone = client.responses.create(input="And then?", max_output_tokens=4, store=False)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > alone.usage.input_tokens  # the earlier turns are in the prompt
    with pytest.raises(openai.NotFoundError, match="previous_response_id|no stored response"):
        client.responses.create(input="x", previous_response_id="resp_missing")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(alone.id)  # store false: not kept


@pytest.mark.parametrize(
    "body, message",
    [
        ({"input": "x", "tools": [{"type": "web_search"}]}, "only function tools"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
            "text only",
        ),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "r"}}}, "needs its schema"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "holds no message"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "model": "other"}, "does not exist"),
    ],
)
def test_bad_requests_are_openai_errors_that_say_why(mock_server, body, message):
    server = mock_server()
    answer = httpx.post(server.base_url + "/v1/responses", json=body, timeout=30)
    assert answer.status_code in (400, 404) and message in answer.json()["error"]["message"]


def test_a_stream_the_engine_stops_ends_with_error_and_response_failed(make_mock_engine):
    from tests.server.live_server import LiveServer

    server = LiveServer(make_mock_engine({"decode_latency_per_step": 0.01}), drain_seconds=0.2).__enter__()
    body = {"input": "long", "max_output_tokens": 1500, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/responses", json=body, timeout=30) as response:
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data: ") and "output_text.delta" in line)
        server.__exit__(None, None, None)  # drain briefly, then abort the stream
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2]["code"] == "engine_unavailable" and events[-1]["response"]["status"] == "failed"
    assert events[-1]["response"]["error"]["code"] == "engine_unavailable"


def test_top_logprobs_come_back_on_the_output_text_streamed_and_not(mock_server):
    client = mock_server().client()  # the mock has no logits: each token's logprob is null, as on chat
    result = client.responses.create(model="test-model", input="Hi", max_output_tokens=5, top_logprobs=2)
    logprobs = result.output[0].content[0].logprobs
    assert len(logprobs) == 5 and "".join(entry.token for entry in logprobs) == result.output_text
    with client.responses.stream(
        model="test-model", input="Hi", max_output_tokens=5, top_logprobs=2
    ) as stream:
        streamed = [entry for e in stream if e.type == "response.output_text.delta" for entry in e.logprobs]
    assert [entry.token for entry in streamed] == [entry.token for entry in logprobs]
    plain = client.responses.create(model="test-model", input="Hi", max_output_tokens=5)
    assert plain.output[0].content[0].logprobs is None


# field -> a non-default value the chat request must carry (under the chat name when it differs)
TO_CHAT = {
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 5,
    "seed": 7,
    "parallel_tool_calls": False,
    "user": "ann",
    "stream": True,
    "min_tokens": 2,
    "stop_token_ids": [3],
    "logit_bias": {"5": 1.5},
    "bad_words": ["no"],
    "allowed_token_ids": [1, 2],
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "include_stop_str_in_output": True,
    "prompt_logprobs": 1,
    "top_logprobs": 2,
    ("max_output_tokens", "max_tokens"): 7,
}
ROUTED = {
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "text",  # the tests above
    "store",
    "previous_response_id",
    "metadata",
}  # the store test; metadata is given back


def test_every_responses_field_is_placed_and_reaches_the_chat_request():
    from hetero_core.openai_api.responses_convert import chat_request
    from hetero_core.openai_api.responses_protocol import ResponsesRequest

    names = {key[0] if isinstance(key, tuple) else key: key for key in TO_CHAT}
    assert set(ResponsesRequest.model_fields) == set(names) | ROUTED
    for name, key in names.items():
        chat = chat_request(ResponsesRequest.model_validate({"input": "x", name: TO_CHAT[key]}), [])
        assert getattr(chat, key[1] if isinstance(key, tuple) else name) == TO_CHAT[key], name
    body = ResponsesRequest.model_validate({"input": "x", "instructions": "be brief", "metadata": {"k": "v"}})
    assert [m.role for m in chat_request(body, [{"role": "user", "content": "before"}]).messages] == [
        "system",
        "user",
        "user",
    ]
