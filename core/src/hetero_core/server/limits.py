"""ASGI guards in front of the routes, in the order they run: the API key, checked from the headers
alone, then the request body size limit. An unauthenticated client never makes the server read its body.
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers

from hetero_core.server.errors import APIError, error_response
from hetero_core.server.settings import DEFAULT_MAX_BODY_BYTES

# Paths that need no key (probes and scrapers; the chat page's too when it is on: page.PAGE_PATHS).
# Everything else does, /openapi.json included.
PUBLIC_PATHS = frozenset({"/health", "/metrics"})
# A refused request whose body is at most this long (by Content-Length) keeps its connection: uvicorn
# discards that much unread body itself. A longer or unsized body is not read: the answer closes it.
UNREAD_BODY_KEEPALIVE_BYTES = 64 * 1024
# Past the size limit, up to this many more bytes are read and discarded before the 413 goes out, so
# an authorized client still uploading reads the answer instead of a reset (nginx's "lingering close").
LINGER_BYTES = 64 * 1024 * 1024


class ApiKeyGuard:
    """``Authorization: Bearer <key>`` on every path but ``public_paths`` when a key is set; a request
    without it gets 401 before any of its body is read."""

    def __init__(self, app, api_key: str | None = None, public_paths: frozenset[str] = PUBLIC_PATHS) -> None:
        self.app, self.key = app, api_key.encode() if api_key else None
        self.public_paths = public_paths

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or self.key is None or scope["path"] in self.public_paths:
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        header = headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.key):
            return await self.app(scope, receive, send)
        what = "missing" if not header else "wrong"
        response = error_response(
            APIError(
                401,
                f"{what} API key: send 'Authorization: Bearer <key>' with the server's key "
                "(--api-key / HETERO_API_KEY)",
                "authentication_error",
                code="invalid_api_key",
            )
        )
        length = _content_length(headers)
        if length is None or length > UNREAD_BODY_KEEPALIVE_BYTES:
            response.headers["connection"] = "close"
        await response(scope, receive, send)


class BodySizeLimit:
    """Refuse bodies over ``max_bytes`` with 413: by Content-Length before any route runs, else while
    reading. The rest of the body (up to ``LINGER_BYTES``) is drained first, then the connection closes."""

    def __init__(self, app, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app, self.max_bytes = app, max_bytes

    def too_large(self) -> APIError:
        return APIError(
            413,
            f"the request body is larger than the server's limit of {self.max_bytes} bytes (max_body_bytes)",
            code="request_too_large",
        )

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = _content_length(Headers(scope=scope))
        if length is not None and length > self.max_bytes:
            await _drain(receive, LINGER_BYTES)
            response = error_response(self.too_large())
            response.headers["connection"] = "close"
            return await response(scope, receive, send)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    if message.get("more_body", False):
                        await _drain(receive, LINGER_BYTES)
                    raise self.too_large()
            return message

        await self.app(scope, limited_receive, send)


def _content_length(headers: Headers) -> int | None:
    value = headers.get("content-length", "")
    return int(value) if value.isascii() and value.isdigit() else None


async def _drain(receive, budget: int) -> None:
    """Read and discard the rest of the request body, at most ``budget`` bytes."""
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request":
            return
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return
