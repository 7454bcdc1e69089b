"""GET / : a small chat page to try the server from a browser (``server/page/``: one HTML file, one
script, one stylesheet; no framework, nothing fetched from elsewhere, so it works on a machine with no
network). The page is only a client of the API: it calls ``/v1/models``, ``/v1/chat/completions`` and
``/metrics`` like any other client, with the API key the user types in when the server has one. So the
page's own paths need no key (there is nothing behind them but these files) while the API stays closed.

``--no-chat-page`` (``chat_page = false``) leaves the router out: ``GET /`` is then 404, as without it.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

PAGE_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/page/chat.js": ("chat.js", "text/javascript; charset=utf-8"),
    "/page/chat.css": ("chat.css", "text/css; charset=utf-8"),
}
# The paths that serve the page; public (no API key) when the page is on.
PAGE_PATHS = frozenset(PAGE_FILES)
# The browser loads nothing but this server's own files, and talks to nothing else.
CONTENT_SECURITY_POLICY = "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'"

router = APIRouter(include_in_schema=False)  # not part of the API the schema describes


def _page_file(name: str) -> bytes:
    return files("hetero_core.server").joinpath("page", name).read_bytes()


def _add_route(path: str, name: str, media_type: str) -> None:
    body = _page_file(name)  # read once, at import: a missing file fails at start, not per request

    async def serve_file() -> Response:
        return Response(
            body,
            media_type=media_type,
            headers={"content-security-policy": CONTENT_SECURITY_POLICY, "cache-control": "no-cache"},
        )

    router.add_api_route(path, serve_file, methods=["GET"], name=f"page:{name}")


for _path, (_name, _media_type) in PAGE_FILES.items():
    _add_route(_path, _name, _media_type)
