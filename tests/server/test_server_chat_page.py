"""The chat page at ``GET /`` (server/page.py): served from the package with nothing from elsewhere, open
without the API key while the API it calls stays closed, and gone with ``--no-chat-page``. The page's
behaviour in a browser: test_server_chat_page_browser.py."""

from __future__ import annotations

import re

import httpx
import pytest

from hetero_core.cli.main import build_parser
from hetero_core.server.app import openapi_schema
from hetero_core.server.page import PAGE_PATHS
from hetero_core.server.settings import load_server_settings

ASSETS = {"/page/chat.js": "text/javascript", "/page/chat.css": "text/css"}


def test_the_page_and_its_assets_are_served_with_nothing_from_elsewhere(mock_server):
    server = mock_server()
    page = httpx.get(server.base_url + "/", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    links = re.findall(r'(?:src|href)="([^"]*)"', page.text)
    assert set(ASSETS) <= set(links)
    assert [link for link in links if re.match(r"(https?:)?//", link)] == []
    for path, media_type in ASSETS.items():
        asset = httpx.get(server.base_url + path, timeout=30)
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(media_type)
        assert not re.search(r"https?://", asset.text), path  # no CDN, no font or script fetched elsewhere
    script = httpx.get(server.base_url + "/page/chat.js", timeout=30).text
    assert "/v1/chat/completions" in script and "include_usage" in script and "json_schema" in script


def test_with_an_api_key_the_page_is_open_and_the_api_stays_closed(mock_server):
    server = mock_server(api_key="sk-page")
    for path in PAGE_PATHS:
        assert httpx.get(server.base_url + path, timeout=30).status_code == 200, path
    closed = httpx.get(server.base_url + "/v1/models", timeout=30)
    assert closed.status_code == 401 and closed.json()["error"]["code"] == "invalid_api_key"
    # Only GET serves the page: other methods on its paths get no further than an unknown route would.
    assert httpx.post(server.base_url + "/", timeout=30).status_code == 405
    opened = httpx.get(
        server.base_url + "/v1/models", headers={"authorization": "Bearer sk-page"}, timeout=30
    )
    assert opened.status_code == 200 and opened.json()["data"][0]["id"] == server.model_name


@pytest.mark.parametrize("api_key, status", [(None, 404), ("sk-page", 401)])
def test_without_the_page_its_paths_are_unknown_as_before(mock_server, api_key, status):
    server = mock_server(api_key=api_key, chat_page=False)
    for path in PAGE_PATHS:  # with a key, an unknown path is 401 (nothing is revealed without it)
        assert httpx.get(server.base_url + path, timeout=30).status_code == status, path


def test_the_page_is_not_in_the_api_schema():
    paths = openapi_schema(has_api_key=False)["paths"]
    assert not PAGE_PATHS & set(paths) and "/v1/chat/completions" in paths


def test_no_chat_page_comes_from_the_flag_or_the_environment(monkeypatch):
    args = build_parser().parse_args(["serve", "--no-chat-page"])
    assert load_server_settings(chat_page=args.chat_page).chat_page is False
    args = build_parser().parse_args(["serve"])
    assert args.chat_page is None and load_server_settings(chat_page=args.chat_page).chat_page is True
    monkeypatch.setenv("HETERO_CHAT_PAGE", "false")
    assert load_server_settings().chat_page is False
