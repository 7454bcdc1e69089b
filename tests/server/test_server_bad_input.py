"""Bad requests get OpenAI error JSON with a 4xx naming the field, and hurt nobody else."""

from __future__ import annotations

import http.client
import json
import logging
import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from hetero_core.engine.requests.params import SamplingParams

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "hi"}]

BAD = [
    # (path, body, status, field the message must name)
    (COMPLETIONS, b'{"prompt": "unterminated', 400, "JSON"),
    (COMPLETIONS, b"[1, 2, 3]", 400, "JSON object"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    (COMPLETIONS, {"prompt": {"text": "x"}}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [1, "two"]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": ""}, 400, "prompt"),
    (COMPLETIONS, {"prompt": []}, 400, "prompt"),
    (COMPLETIONS, {"max_tokens": 3}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens 0 generates nothing: it needs echo"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    (
        CHAT,
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    ],
                }
            ]
        },
        400,
        "messages[0].content[1] is an image_url part; this model takes text only",
    ),
    (
        CHAT,
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}],
                },
            ]
        },
        400,
        "messages[1].content[0] is an input_audio part; this model takes text only",
    ),
    (COMPLETIONS, {"prompt": "x", "max_tokens": 10**9}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "x" * 200, "max_tokens": 1}, 400, "max_model_len"),
    (COMPLETIONS, {"prompt": "x", "top_p": 0}, 400, "top_p"),
    (COMPLETIONS, {"prompt": "x", "n": 0}, 400, "n"),
    (COMPLETIONS, {"prompt": "x", "stop": ["ok", ""]}, 400, "stop"),
    (COMPLETIONS, {"prompt": "x", "logprobs": 99}, 400, "logprobs"),
    (COMPLETIONS, {"prompt": [99999]}, 400, "range"),
    (COMPLETIONS, {"prompt": "x", "model": "gpt-4o"}, 404, "gpt-4o"),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
    (CHAT, {"messages": "hi"}, 400, "messages"),
    (CHAT, {"messages": MESSAGES, "max_completion_tokens": -5}, 400, "max_completion_tokens"),
    (CHAT, {"messages": MESSAGES, "presence_penalty": 9}, 400, "presence_penalty"),
    ("/v1/nowhere", {}, 404, "Not Found"),
    # Strict types, as OpenAI and vLLM: nothing is coerced.
    (COMPLETIONS, {"prompt": "x", "max_tokens": "5"}, 400, "max_tokens: Input should be a valid integer"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": 2.0}, 400, "max_tokens: Input should be a valid integer"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": True}, 400, "max_tokens: Input should be a valid integer"),
    (COMPLETIONS, {"prompt": "x", "stream": "yes"}, 400, "stream: Input should be a valid boolean"),
    (COMPLETIONS, {"prompt": "x", "n": "2"}, 400, "n: Input should be a valid integer"),
    (CHAT, {"messages": MESSAGES, "logprobs": 1}, 400, "logprobs: Input should be a valid boolean"),
    (
        CHAT,
        {"messages": MESSAGES, "stream_options": {"include_usage": "true"}},
        400,
        "stream_options.include_usage",
    ),
    (CHAT, {"messages": MESSAGES, "temperature": "0.5"}, 400, "temperature: Input should be a valid number"),
    # JSON the parser must bound: nesting, huge integers, huge floats, lone surrogates.
    (COMPLETIONS, b'{"prompt": "x", "extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "nest at most"),
    (COMPLETIONS, b'{"prompt": "x", "seed": ' + b"7" * 5000 + b"}", 400, "at most 4300 digits"),
    (
        CHAT,
        b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1' + b"0" * 400 + b"}",
        400,
        "temperature: Input should be a finite number",
    ),
    (CHAT, b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', 400, "valid Unicode"),
    (COMPLETIONS, b'{"prompt": "\\udc80"}', 400, "valid Unicode"),
    (COMPLETIONS, b'{"prompt": "\xed\xa0\x80"}', 400, "not valid JSON"),  # a surrogate as UTF-8 bytes
    (COMPLETIONS, b"", 400, "empty"),
    (COMPLETIONS, b'"just a string"', 400, "JSON object, got a string"),
]


def post(base_url: str, path: str, body, **kwargs) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        base_url + path, content=content, headers={"content-type": "application/json"}, timeout=60, **kwargs
    )


@pytest.mark.parametrize("path,body,status,named", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_request_gets_openai_error_json_naming_the_field(mock_server, path, body, status, named):
    server = mock_server(max_model_len=128)
    response = post(server.base_url, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert named in error["message"]


def test_every_bad_request_keeps_its_keep_alive_connection(mock_server):
    """The error answers on the connection it came on and the next request there is served: nothing
    a client sends makes the server drop (reset) a keep-alive connection."""
    server = mock_server(max_model_len=128)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.connect()
    sock = connection.sock
    for path, body, status, _ in BAD:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        connection.request("POST", path, content, {"content-type": "application/json"})
        response = connection.getresponse()
        assert (response.status, response.getheader("content-type")) == (status, "application/json"), body
        assert "error" in json.loads(response.read())
        assert not response.will_close, body
        connection.request("GET", "/v1/models")
        response = connection.getresponse()
        assert response.status == 200 and json.loads(response.read())["data"][0]["id"] == "test-model"
        assert connection.sock is sock, body  # the same connection throughout
    connection.close()


def test_a_lone_surrogate_is_a_clear_400_and_logs_no_error(mock_server, caplog):
    server = mock_server()
    body = (
        b'{"messages": [{"role": "user", "content": "caf\\udce9"}]}'  # no max_tokens: fitted to the context
    )
    with caplog.at_level(logging.INFO, logger="hetero"):
        response = post(server.base_url, CHAT, body)
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "valid Unicode" in message and "Error(" not in message  # no exception repr
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_50_mb_body_is_refused_with_413(mock_server):
    server = mock_server()
    big = b'{"prompt": "' + b"a" * (50 * 1024 * 1024) + b'"}'
    response = post(server.base_url, COMPLETIONS, big)
    assert response.status_code == 413
    assert "max_body_bytes" in response.json()["error"]["message"]

    def chunks():  # no Content-Length: the limit applies while reading
        for _ in range(50):
            yield b"a" * (1024 * 1024)

    response = httpx.post(server.base_url + COMPLETIONS, content=chunks(), timeout=60)
    assert response.status_code == 413
    assert httpx.get(server.base_url + "/health").status_code == 200


def test_storm_of_bad_requests_leaves_every_good_one_correct(mock_server, make_mock_engine):
    mock = {"decode_latency_per_step": 0.001}
    server = mock_server(mock, max_model_len=128)
    good = [(f"good request {i}", 3 + i % 5, i) for i in range(24)]
    offline = make_mock_engine(mock, max_model_len=128)
    expected = [offline.generate([p], SamplingParams(max_tokens=m, seed=s))[0].text for p, m, s in good]
    rng = random.Random(0)
    jobs = [("good", i) for i in range(len(good))] + [("bad", i % len(BAD)) for i in range(72)]
    rng.shuffle(jobs)

    def run(job):
        kind, i = job
        if kind == "bad":
            path, body, status, _ = BAD[i]
            return kind, i, post(server.base_url, path, body).status_code
        prompt, max_tokens, seed = good[i]
        body = {"prompt": prompt, "max_tokens": max_tokens, "seed": seed, "stream": i % 2 == 0}
        if i % 2:
            return kind, i, post(server.base_url, COMPLETIONS, body).json()["choices"][0]["text"]
        with httpx.stream("POST", server.base_url + COMPLETIONS, json=body, timeout=60) as response:
            events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        return kind, i, "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])

    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(run, jobs, timeout=300))
    for kind, i, value in results:
        if kind == "bad":
            assert value == BAD[i][2]
        else:
            assert value == expected[i], good[i]
    assert server.wait_until_idle()
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}
