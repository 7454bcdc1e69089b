"""A real uvicorn server on a free loopback port, in a background thread, around an engine."""

from __future__ import annotations

import socket
import threading
import time

from hetero_core.async_llm import AsyncLLM
from hetero_core.server.app import create_app
from hetero_core.server.metrics import EngineMetrics
from hetero_core.server.runner import make_uvicorn_server

START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 30


class LiveServer:
    """``with LiveServer(engine) as server:`` gives ``server.base_url``, ``server.llm`` and
    ``server.client()``."""

    def __init__(
        self,
        engine,
        *,
        model_name: str = "test-model",
        api_key: str | None = None,
        max_pending_requests: int = 512,
        max_body_bytes: int | None = None,
        drain_seconds: float = 5.0,
        chat_page: bool = True,
    ) -> None:
        self.metrics = EngineMetrics()
        self.llm = AsyncLLM(engine, max_pending_requests=max_pending_requests, observer=self.metrics)
        kwargs = {"max_body_bytes": max_body_bytes} if max_body_bytes else {}
        self.app = create_app(
            self.llm,
            model_name=model_name,
            api_key=api_key,
            engine_metrics=self.metrics,
            shutdown_llm=True,
            max_pending_choices=max_pending_requests,
            chat_page=chat_page,
            **kwargs,
        )
        self.model_name, self.api_key = model_name, api_key
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._server = make_uvicorn_server(self.app, drain_seconds=drain_seconds, log_level="warning")
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def __enter__(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(STOP_TIMEOUT_S)
        self._sock.close()
        self.llm.shutdown()  # no-op if the app's shutdown already stopped it

    def client(self, api_key: str | None = None, **kwargs):
        import openai

        key = api_key or self.api_key or "unused"
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=key, max_retries=0, timeout=60, **kwargs)

    def async_client(self, **kwargs):
        import openai

        return openai.AsyncOpenAI(
            base_url=self.base_url + "/v1",
            api_key=self.api_key or "unused",
            max_retries=0,
            timeout=60,
            **kwargs,
        )

    def wait_until_idle(self, timeout_s: float = 30) -> bool:
        """True once no request is pending and every KV block is free again (bounded wait)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            s = self.llm.stats
            if s.num_pending == 0 and s.num_free_blocks == s.num_blocks and s.num_running == 0:
                return True
            time.sleep(0.01)
        return False
