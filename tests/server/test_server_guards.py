"""What the server refuses before any work: unauthenticated clients (before reading their bodies, the
schema included), requests with more choices than it runs, clients that leave mid-upload."""

from __future__ import annotations

import json
import logging
import socket
import time

import httpx
import openai
import pytest

COMPLETIONS = "/v1/completions"


def raw_exchange(port: int, head: bytes, body: bytes = b"", timeout: float = 30) -> bytes:
    """Send ``head`` (and ``body``) on a fresh connection; what the server answers before it closes or
    goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head + body)
        return sock.recv(65536)


def test_an_unauthenticated_client_is_refused_before_its_body_is_read(mock_server):
    server = mock_server(api_key="sk-right")
    # Headers announce 64 MB; none of it is sent. The key is checked from the headers alone, so the
    # 401 comes at once (the body limit used to wait for, and read, the whole body first).
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 67108864\r\n\r\n"
    )
    answer = raw_exchange(server.port, head)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b"connection: close" in answer.lower()
    assert b"invalid_api_key" in answer
    # Over the body limit with a wrong key: 401 (not 413, which needs the body read first).
    response = httpx.post(
        server.base_url + COMPLETIONS,
        content=b"x" * (17 * 1024 * 1024),
        headers={"authorization": "Bearer sk-wrong"},
        timeout=60,
    )
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    # With the key, the same body is measured against the limit as before.
    response = httpx.post(
        server.base_url + COMPLETIONS,
        content=b"x" * (17 * 1024 * 1024),
        headers={"authorization": "Bearer sk-right"},
        timeout=60,
    )
    assert response.status_code == 413


def test_a_small_unauthenticated_body_keeps_the_connection(mock_server):
    server = mock_server(api_key="sk-right")
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        assert client.post(COMPLETIONS, json={"prompt": "x"}).status_code == 401
        good = client.post(
            COMPLETIONS, json={"prompt": "x", "max_tokens": 2}, headers={"authorization": "Bearer sk-right"}
        )
        assert good.status_code == 200


def test_the_schema_needs_the_key_when_the_server_has_one(mock_server):
    server = mock_server(api_key="sk-right")
    response = httpx.get(server.base_url + "/openapi.json")
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.base_url + "/v1/nowhere").status_code == 401  # no route is revealed either
    schema = httpx.get(server.base_url + "/openapi.json", headers={"authorization": "Bearer sk-right"}).json()
    assert schema["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
    completions = schema["paths"][COMPLETIONS]["post"]
    assert completions["security"] == [{"bearer": []}]
    assert completions["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CompletionRequest"
    }
    assert schema["components"]["schemas"]["CompletionRequest"]["properties"]["max_tokens"]["anyOf"][0] == {
        "type": "integer",
        "minimum": 0,
    }  # 0: with echo, the prompt alone
    # Probes and scrapers need no key.
    assert httpx.get(server.base_url + "/health").status_code == 200
    assert httpx.get(server.base_url + "/metrics").status_code == 200


def test_the_schema_is_public_without_a_key(mock_server):
    server = mock_server()
    schema = httpx.get(server.base_url + "/openapi.json").json()
    assert "securitySchemes" not in schema["components"]
    assert "security" not in schema["paths"][COMPLETIONS]["post"]


def test_too_many_choices_are_refused_before_any_engine_work(mock_server):
    server = mock_server(max_pending_requests=512)
    client = server.client()
    with pytest.raises(openai.BadRequestError) as info:  # 40 prompts x n=16 = 640 choices > 512
        client.completions.create(model="test-model", prompt=["count to ten"] * 40, n=16, max_tokens=64)
    error = info.value.body
    assert error["code"] == "too_many_choices" and error["param"] == "prompt"
    assert (
        "640 choices (40 prompts x n=16)" in error["message"] and "max_pending_requests" in error["message"]
    )
    assert server.llm.stats.num_steps == 0  # the engine never saw them
    assert server.llm.stats.num_pending == 0
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="test-model", prompt="x", n=17)
    assert info.value.body["param"] == "n"
    assert server.llm.stats.num_steps == 0


def test_choices_that_do_not_fit_now_get_429_and_run_nothing(mock_server):
    server = mock_server({"decode_latency_per_step": 0.01}, max_pending_requests=8)
    client = server.client()
    running = client.completions.create(model="test-model", prompt="long", max_tokens=2000, n=6, stream=True)
    next(iter(running))  # six choices pending
    steps = server.llm.stats.num_steps
    with pytest.raises(openai.RateLimitError) as info:
        client.completions.create(model="test-model", prompt="more", max_tokens=2, n=4)
    assert info.value.body["code"] == "too_many_pending_requests"
    assert "4 choices" in info.value.body["message"]
    running.close()
    assert server.wait_until_idle()
    assert server.metrics.prompt_tokens._value.get() == len(b"long") * 6  # "more" never reached the engine
    assert server.llm.stats.num_steps >= steps


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def server_logs():
    """Every record of the server's loggers (ours and uvicorn's), whatever their propagation."""
    handler = _Records()
    loggers = [logging.getLogger(name) for name in ("hetero", "uvicorn", "uvicorn.error")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    yield handler.records
    for logger, level in zip(loggers, levels):
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_a_client_leaving_mid_upload_is_one_quiet_event(mock_server, server_logs):
    server = mock_server()
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000000\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head + b'{"prompt": "' + b"a" * 100_000)
    deadline = time.monotonic() + 30
    while (
        not any("client_disconnected" in r.getMessage() for r in server_logs) and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    events = [r for r in server_logs if "client_disconnected" in r.getMessage()]
    assert len(events) == 1 and events[0].levelno == logging.INFO
    assert "during=upload" in events[0].getMessage()
    assert not [r for r in server_logs if r.levelno >= logging.WARNING], [r.getMessage() for r in server_logs]
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}


def test_an_unhandled_error_is_openai_json_and_keeps_the_connection(mock_server, server_logs):
    server = mock_server()

    @server.app.get("/v1/boom")  # a route with a bug, standing in for any
    async def boom():
        raise RuntimeError("a bug")

    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        response = client.get("/v1/boom")
        assert response.status_code == 500
        assert response.json()["error"] == {
            "message": "internal server error: RuntimeError",
            "type": "server_error",
            "param": None,
            "code": None,
        }
        assert client.get("/v1/models").status_code == 200
    errors = [r for r in server_logs if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "server.internal_error" in errors[0].getMessage()
    assert json.dumps(response.json())  # plain JSON, not Starlette's text
