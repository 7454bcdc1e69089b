"""Role processes (``hetero serve --role prefill|decode``) as subprocesses, and the OpenAI front end over
them in a background thread, for the disaggregation tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import httpx

from hetero_core.disagg.client import DisaggregatedClient
from hetero_core.disagg.frontend import create_frontend_app
from hetero_core.server.runner import make_uvicorn_server

START_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Role:
    def __init__(self, role: str, flags: list[str], env: dict | None = None) -> None:
        self.role, self.port = role, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hetero_core", "serve", "--role", role, "--port", str(self.port), *flags],
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError(f"the {self.role} role did not start: {self.output()}")

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(30)

    def output(self) -> str:
        if self.process.poll() is None:
            self.kill()
        return self.process.stdout.read()


class FrontEnd:
    """The OpenAI app over a ``DisaggregatedClient``, served by uvicorn in a thread."""

    def __init__(self, prefill_url: str, decode_url: str, timeout_s: float = 10.0) -> None:
        self.client = DisaggregatedClient(prefill_url, decode_url, timeout_s=timeout_s)
        self.app = create_frontend_app(self.client, model_name="m")
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._server = make_uvicorn_server(self.app, drain_seconds=1.0, log_level="warning")
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def __enter__(self) -> FrontEnd:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the front end did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(30)
        self._sock.close()
        self.client.shutdown()

    def openai(self, **kwargs):
        import openai

        return openai.OpenAI(
            base_url=self.base_url + "/v1", api_key="unused", max_retries=0, timeout=60, **kwargs
        )
