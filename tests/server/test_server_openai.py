"""The OpenAI endpoints against a live server on loopback, with the official openai client (mock executor)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from hetero_core.engine.requests.params import SamplingParams


def offline(make_mock_engine, prompt, mock_options=None, **params):
    """What the engine produces offline for the same prompt and parameters."""
    engine = make_mock_engine(mock_options)
    [out] = engine.generate([prompt], SamplingParams(**params))
    return out


def test_completion_matches_the_engine_and_counts_real_tokens(mock_server, make_mock_engine):
    server = mock_server()
    result = server.client().completions.create(
        model="test-model", prompt="Hello there", max_tokens=12, seed=3
    )
    expected = offline(make_mock_engine, "Hello there", max_tokens=12, seed=3)
    assert result.object == "text_completion" and result.model == "test-model"
    assert [c.text for c in result.choices] == [expected.text]
    assert result.choices[0].finish_reason == "length"
    assert result.usage.prompt_tokens == len(b"Hello there") == len(expected.prompt_token_ids)
    assert result.usage.completion_tokens == 12
    assert result.usage.total_tokens == result.usage.prompt_tokens + 12


def test_streamed_completion_concatenates_to_the_full_text_and_ends_with_usage(mock_server, make_mock_engine):
    server = mock_server()
    stream = server.client().completions.create(
        model="test-model",
        prompt="Stream me",
        max_tokens=10,
        seed=1,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    expected = offline(make_mock_engine, "Stream me", max_tokens=10, seed=1)
    text_chunks = [c for c in chunks if c.choices]
    assert len(text_chunks) >= 2  # one chunk per new text piece, not one blob
    assert "".join(c.choices[0].text for c in text_chunks) == expected.text
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == len(b"Stream me")


def test_stream_ends_with_done_marker(mock_server):
    server = mock_server()
    body = {"prompt": "x", "max_tokens": 3, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)


def test_chat_uses_the_chat_format_and_streams_role_then_content(mock_server, make_mock_engine):
    server = mock_server()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    client = server.client()
    result = client.chat.completions.create(
        model="test-model", messages=messages, max_completion_tokens=8, seed=5
    )
    expected = offline(make_mock_engine, messages, max_tokens=8, seed=5)
    assert result.choices[0].message.role == "assistant"
    assert result.choices[0].message.content == expected.text
    assert result.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert result.usage.prompt_tokens == len(b"system: Be brief.\nuser: Hi!\nassistant: ")

    stream = client.chat.completions.create(
        model="test-model",
        messages=messages,
        max_tokens=8,
        seed=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == expected.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.total_tokens == result.usage.total_tokens


def test_chat_without_max_tokens_fits_the_context(mock_server):
    server = mock_server(max_model_len=64, max_tokens=256)
    result = server.client().chat.completions.create(
        model="test-model", messages=[{"role": "user", "content": "hey"}]
    )
    assert result.usage.total_tokens == 64
    assert result.choices[0].finish_reason == "length"


def test_eos_finishes_with_stop(mock_server):
    server = mock_server({"eos_after": 4})
    result = server.client().completions.create(model="test-model", prompt="abc", max_tokens=50)
    assert result.choices[0].finish_reason == "stop"
    assert result.usage.completion_tokens == 4  # three text tokens and EOS
    assert len(result.choices[0].text) == 3


def test_n_choices_and_several_prompts(mock_server, make_mock_engine):
    server = mock_server()
    client = server.client()
    result = client.completions.create(model="test-model", prompt="same", max_tokens=6, n=3, seed=10)
    assert [c.index for c in result.choices] == [0, 1, 2]
    # choice i of a seeded request uses seed + i: distinct and reproducible
    expected = [offline(make_mock_engine, "same", max_tokens=6, seed=10 + i).text for i in range(3)]
    assert [c.text for c in result.choices] == expected
    assert len(set(expected)) == 3
    assert result.usage.prompt_tokens == 4 and result.usage.completion_tokens == 18

    batch = client.completions.create(model="test-model", prompt=["ab", "cde"], max_tokens=4, n=2, seed=0)
    assert len(batch.choices) == 4
    assert batch.usage.prompt_tokens == 2 + 3
    streamed = client.completions.create(
        model="test-model", prompt="same", max_tokens=6, n=3, seed=10, stream=True
    )
    texts = ["", "", ""]
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == expected


def test_stop_string_truncates_in_both_modes(mock_server, make_mock_engine):
    server = mock_server()
    full = offline(make_mock_engine, "stop test", max_tokens=40, seed=2).text
    stop = full[10:12]  # two characters that occur in the output
    cut = full[: full.index(stop)]
    client = server.client()
    result = client.completions.create(
        model="test-model", prompt="stop test", max_tokens=40, seed=2, stop=[stop]
    )
    assert result.choices[0].text == cut and result.choices[0].finish_reason == "stop"
    stream = client.completions.create(
        model="test-model", prompt="stop test", max_tokens=40, seed=2, stop=stop, stream=True
    )
    pieces = [c.choices[0].text for c in stream if c.choices]
    assert "".join(pieces) == cut  # no piece of the stop string was streamed before the match


def test_seed_reproduces_and_different_seeds_differ(mock_server):
    client = mock_server().client()

    def run(seed):
        return (
            client.completions.create(
                model="test-model", prompt="seeded", max_tokens=16, seed=seed, temperature=0.8
            )
            .choices[0]
            .text
        )

    assert run(42) == run(42)
    assert run(42) != run(43)


def test_models_and_health(mock_server):
    server = mock_server()
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["test-model"]
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}


def test_api_key_missing_or_wrong_gets_401(mock_server):
    server = mock_server(api_key="sk-right")
    assert server.client().completions.create(model="test-model", prompt="ok", max_tokens=2).choices
    with pytest.raises(openai.AuthenticationError) as info:
        server.client(api_key="sk-wrong").completions.create(model="test-model", prompt="no", max_tokens=2)
    assert info.value.status_code == 401
    assert info.value.body["code"] == "invalid_api_key"
    response = httpx.post(server.base_url + "/v1/chat/completions", json={"messages": []})
    assert response.status_code == 401 and "missing API key" in response.json()["error"]["message"]
    assert httpx.get(server.base_url + "/health").status_code == 200  # probes need no key


def test_priority_and_user_are_accepted(mock_server):
    client = mock_server().client()
    result = client.completions.create(
        model="test-model", prompt="p", max_tokens=3, user="tenant-a", extra_body={"priority": -1}
    )
    assert result.usage.completion_tokens == 3


def test_streamed_chunks_carry_their_null_fields_as_the_json_answer_does(mock_server):
    """Found by the schema fuzzer: stream chunks dropped every null, required ones included (a token's
    ``logprob`` is null on an executor without logits), so chunks broke the documented schema."""
    server = mock_server()
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "logprobs": True,
        "stream": True,
    }
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=30) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events[:-1]]
    tokens = [
        t
        for c in chunks
        for choice in c["choices"]
        if choice["logprobs"]
        for t in choice["logprobs"]["content"]
    ]
    assert len(tokens) == 3
    assert all(set(t) == {"token", "logprob", "bytes", "top_logprobs"} for t in tokens)
    assert all("finish_reason" in choice for c in chunks for choice in c["choices"])
    full = server.client().chat.completions.create(model="test-model", **{**body, "stream": False})
    assert full.choices[0].logprobs.content[0].logprob is None  # the same null, in both shapes
