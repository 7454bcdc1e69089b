"""ASGI guards in front of the routes: the request body size limit and the API key."""

from __future__ import annotations

import hmac
import json

from fastapi import Request
from starlette.exceptions import HTTPException

from hetero_core.server.errors import APIError, error_body

from hetero_core.server.settings import DEFAULT_MAX_BODY_BYTES


class BodyTooLarge(HTTPException):
    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"the request body is larger than the server's limit of {max_bytes} bytes "
                              "(max_body_bytes)")


# Past the limit, up to this many more bytes are read and discarded before the 413 goes out, so a
# client still uploading reads the answer instead of a reset connection (nginx's "lingering close").
LINGER_BYTES = 64 * 1024 * 1024


class BodySizeLimit:
    """Refuse bodies over ``max_bytes`` with 413: by Content-Length before any route runs, else while
    reading. The rest of the body (up to ``LINGER_BYTES``) is drained first, then the connection closes."""

    def __init__(self, app, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers", ())).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await _drain(receive, LINGER_BYTES)
            return await _send_json(send, 413, BodyTooLarge(self.max_bytes).detail, "request_too_large")
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    if message.get("more_body", False):
                        await _drain(receive, LINGER_BYTES)
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited_receive, send)


async def _drain(receive, budget: int) -> None:
    """Read and discard the rest of the request body, at most ``budget`` bytes."""
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request":
            return
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


async def _send_json(send, status: int, message: str, code: str) -> None:
    body = json.dumps(error_body(message, "invalid_request_error", None, code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def require_api_key(request: Request) -> None:
    """FastAPI dependency for /v1 routes: ``Authorization: Bearer <key>`` when a key is set."""
    expected = request.app.state.hetero.api_key
    if not expected:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
        what = "missing" if not header else "wrong"
        raise APIError(401, f"{what} API key: send 'Authorization: Bearer <key>' with the server's key "
                            "(--api-key / HETERO_API_KEY)", "authentication_error", code="invalid_api_key")
