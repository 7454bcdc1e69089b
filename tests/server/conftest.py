"""Fixtures for the server tests: live servers on loopback around mock (or real) engines."""

from __future__ import annotations

import pytest

try:  # the server extra and the test clients; AsyncLLM's own tests need none of them
    import fastapi  # noqa: F401
    import openai  # noqa: F401
    import uvicorn  # noqa: F401

    from tests.server.live_server import LiveServer
except ImportError:
    collect_ignore_glob = ["test_server_*.py", "test_cli_serve.py"]


@pytest.fixture
def mock_server(make_mock_engine):
    """``mock_server(mock_options=..., api_key=..., chat_page=..., **settings)``: a started LiveServer,
    stopped after the test."""
    started = []

    def start(
        mock_options=None,
        *,
        api_key=None,
        max_pending_requests=512,
        max_body_bytes=None,
        chat_page=True,
        **settings,
    ):
        engine = make_mock_engine(mock_options, **settings)
        server = LiveServer(
            engine,
            api_key=api_key,
            max_pending_requests=max_pending_requests,
            max_body_bytes=max_body_bytes,
            chat_page=chat_page,
        )
        started.append(server)
        return server.__enter__()

    yield start
    for server in started:
        server.__exit__(None, None, None)
