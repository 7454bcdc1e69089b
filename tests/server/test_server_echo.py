"""Completions' ``echo`` on the mock executor: the prompt before the answer, streamed and not; ``max_tokens``
0 gives the prompt alone. (Prompt logprobs need a model: test_completions_echo_real_model.)"""

from __future__ import annotations

import json

import httpx

COMPLETIONS = "/v1/completions"


def post(server, body):
    return httpx.post(server.base_url + COMPLETIONS, json=body, timeout=30)


def streamed(server, body):
    url = server.base_url + COMPLETIONS
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=30) as response:
        assert response.status_code == 200
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_echo_puts_the_prompt_before_the_answer(mock_server):
    server = mock_server()
    plain = post(server, {"prompt": "hello there", "max_tokens": 3, "temperature": 0}).json()
    echoed = post(server, {"prompt": "hello there", "max_tokens": 3, "temperature": 0, "echo": True}).json()
    assert echoed["choices"][0]["text"] == "hello there" + plain["choices"][0]["text"]
    assert echoed["usage"] == plain["usage"]


def test_max_tokens_0_with_echo_gives_the_prompt_alone(mock_server):
    server = mock_server()
    answer = post(server, {"prompt": ["one", "two"], "max_tokens": 0, "echo": True}).json()
    assert [c["text"] for c in answer["choices"]] == ["one", "two"]
    assert [c["finish_reason"] for c in answer["choices"]] == ["length", "length"]
    assert answer["usage"]["completion_tokens"] == 0
    assert answer["usage"]["total_tokens"] == answer["usage"]["prompt_tokens"] > 0


def test_max_tokens_0_without_echo_is_refused_by_name(mock_server):
    response = post(mock_server(), {"prompt": "x", "max_tokens": 0})
    assert response.status_code == 400
    assert "max_tokens 0 generates nothing: it needs echo" in response.json()["error"]["message"]


def test_streamed_echo_sends_the_prompt_in_the_first_chunk(mock_server):
    server = mock_server()
    body = {
        "prompt": "hello there",
        "max_tokens": 4,
        "temperature": 0,
        "echo": True,
        "stream_options": {"include_usage": True},
    }
    whole = post(server, body).json()["choices"][0]["text"]
    chunks = streamed(server, body)
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert texts[0].startswith("hello there") and "".join(texts) == whole
    assert chunks[-1]["usage"]["completion_tokens"] == 4

    alone = streamed(server, {**body, "max_tokens": 0})
    choices = [c["choices"][0] for c in alone if c["choices"]]
    assert "".join(c["text"] for c in choices) == "hello there"
    assert choices[-1]["finish_reason"] == "length"
    assert alone[-1]["usage"]["completion_tokens"] == 0


def test_echo_with_logprobs_needs_prompt_logits_and_says_so(mock_server):
    response = post(mock_server(), {"prompt": "x", "max_tokens": 1, "echo": True, "logprobs": 1})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "echo" and "echo with logprobs lists the prompt's logprobs" in error["message"]
    assert "MockExecutor" in error["message"] and "leave logprobs out, or echo" in error["message"]
