"""``hetero run``'s client of a running ``hetero serve``: one request to its OpenAI API, streamed or not,
over the standard library's ``http.client`` (no httpx, no pydantic models: this path must start fast).

Two ways a request does not get its answer, kept apart because ``hetero run`` treats them apart:
``RequestRefused``, the engine refused or failed the request (the server's 400 ``invalid_request``, or
that error as a stream event): a local run would have failed it too, with the same message, so the run
reports it as a failed request; ``ServerUnavailable``, anything else (refused connection, a dropped
stream, 401, 404, 429, 5xx, a body the server's validation refused where the engine would not): the
server cannot answer for this run, which, if it printed nothing yet, runs the prompt itself.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TextIO

CONNECT_TIMEOUT_S = 5.0
REFUSED_CODE = "invalid_request"  # the server's code for an error of the engine's (server/errors.py)


class ServerUnavailable(Exception):
    """The server did not answer this request; nothing of it was printed by ``stream``'s caller yet
    unless ``printed`` says so."""

    def __init__(self, reason: str, printed: bool = False) -> None:
        super().__init__(reason)
        self.printed = printed


class RequestRefused(Exception):
    """The engine refused or failed the request (what a local run reports as a failed request)."""


@dataclass
class ServerAnswer:
    """One request's answer: its text, its number of generated tokens, the seconds to its first text."""

    text: str = ""
    num_tokens: int = 0
    first_token_s: float | None = None
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None


def request_body(prompt, chat: bool, params, model: str, stream: bool, priority: int, tenant) -> dict:
    """The API request for ``prompt`` (chat messages or text) with every sampling parameter ``hetero
    run`` sets (so no server default applies; ``serve_identity`` covers a missing seed)."""
    body = {
        "model": model,
        ("messages" if chat else "prompt"): prompt,
        "stream": stream,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "min_p": params.min_p,
        "repetition_penalty": params.repetition_penalty,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "max_tokens": params.max_tokens,
        "ignore_eos": params.ignore_eos,
        "priority": priority,
    }
    if params.stop:
        body["stop"] = list(params.stop)
    if params.seed is not None:
        body["seed"] = params.seed
    if tenant is not None:
        body["user"] = tenant
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def path_for(chat: bool) -> str:
    return "/v1/chat/completions" if chat else "/v1/completions"


def fetch(record, body: dict, api_key: str | None) -> ServerAnswer:
    """One request answered whole (``stream`` false)."""
    response = _post(record, path_for("messages" in body), body, api_key)
    try:
        answer = json.loads(response.read())
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise ServerUnavailable(f"the answer was cut off: {exc}") from None
    try:
        choice = answer["choices"][0]
        text = (choice["message"]["content"] or "") if "messages" in body else choice["text"]
        return ServerAnswer(text=text, num_tokens=answer["usage"]["completion_tokens"])
    except (KeyError, IndexError, TypeError) as exc:
        raise ServerUnavailable(f"an answer without {exc}") from None


def stream(record, body: dict, api_key: str | None, out: TextIO, answer: ServerAnswer) -> None:
    """One request streamed, its text written to ``out`` as it arrives and kept in ``answer`` (which
    holds what was printed when this raises)."""
    started = time.perf_counter()
    response = _post(record, path_for("messages" in body), body, api_key)
    chat = "messages" in body
    for event in _events(response, answer):
        if "error" in event:
            error = event["error"] or {}
            message = str(error.get("message", "the server reported an error"))
            if error.get("code") == REFUSED_CODE:
                raise RequestRefused(message)
            raise ServerUnavailable(message, printed=bool(answer.text))
        if event.get("usage"):
            answer.num_tokens = event["usage"].get("completion_tokens", 0)
        for choice in event.get("choices") or ():
            piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            if piece:
                if answer.first_token_s is None:
                    answer.first_token_s = time.perf_counter() - started
                out.write(piece)
                out.flush()
                answer.text += piece


def _events(response, answer: ServerAnswer) -> Iterator[dict]:
    """The stream's events up to ``[DONE]``; a stream that ends before it is a dropped one."""
    try:
        for raw in iter(response.readline, b""):
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                return
            yield json.loads(data)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise ServerUnavailable(f"the stream broke off: {exc}", printed=bool(answer.text)) from None
    raise ServerUnavailable("the stream ended before [DONE]", printed=bool(answer.text))


def _post(record, path: str, body: dict, api_key: str | None) -> http.client.HTTPResponse:
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    connection = http.client.HTTPConnection(record.connect_host, record.port, timeout=CONNECT_TIMEOUT_S)
    try:
        connection.connect()
        connection.sock.settimeout(None)  # an answer takes as long as it takes; Ctrl-C stops the wait
        connection.request("POST", path, json.dumps(body).encode("utf-8"), headers)
        response = connection.getresponse()
    except (OSError, http.client.HTTPException) as exc:
        connection.close()
        raise ServerUnavailable(f"cannot reach {record.url}: {exc}") from None
    if response.status == 200:
        return response
    try:
        error = json.loads(response.read()).get("error") or {}
    except (OSError, http.client.HTTPException, ValueError, AttributeError):
        error = {}
    connection.close()
    message = str(error.get("message", response.reason))
    if response.status == 400 and error.get("code") == REFUSED_CODE:
        raise RequestRefused(message)
    raise ServerUnavailable(f"HTTP {response.status}: {message}")
