"""Bad requests get OpenAI error JSON with a 4xx naming the field, and hurt nobody else."""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from hetero_core.engine.params import SamplingParams

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
    (COMPLETIONS, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
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
]


def post(base_url: str, path: str, body, **kwargs) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(base_url + path, content=content, headers={"content-type": "application/json"},
                      timeout=60, **kwargs)


@pytest.mark.parametrize("path,body,status,named", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_request_gets_openai_error_json_naming_the_field(mock_server, path, body, status, named):
    server = mock_server(max_model_len=128)
    response = post(server.base_url, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert named in error["message"]


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
