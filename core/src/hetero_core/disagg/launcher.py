"""``hetero serve --role prefill|decode`` (one role's server), ``hetero serve --prefill-url URL --decode-url
URL`` (the front end alone, over roles that may run on other machines) and ``hetero serve --disaggregated``: a
prefill and a decode engine as child processes (``hetero serve --role ...`` with the same engine flags,
on free loopback ports) and the OpenAI front end in this process. Children are stopped with it; a child
that dies is reported by the front end's /health and fails only the requests it was serving."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import uvicorn

from hetero_core.async_llm import AsyncLLM
from hetero_core.builder import build_kv_connector
from hetero_core.disagg.client import DisaggregatedClient
from hetero_core.disagg.frontend import create_frontend_app
from hetero_core.disagg.role_apps import create_role_app
from hetero_core.errors import ConfigError
from hetero_core.logging import get_logger
from hetero_core.server.runner import listen, run_server

log = get_logger("hetero.disagg")
START_TIMEOUT_S = 600.0  # a role loads its model (and may convert or time it) before it answers /health
# flags of ``hetero serve`` that the launcher sets itself for its children (with a value, or without)
_OWN_FLAGS_WITH_VALUE = ("--port", "--host", "--role", "--prefill-url", "--decode-url")
_OWN_FLAGS = ("--disaggregated",)


def serve_role(settings, server, log_level: str = "info") -> bool:
    """Serve ``server.role`` until stopped; True if a signal stopped it."""
    with listen(server.host, server.port) as listening:
        llm = AsyncLLM.from_settings(settings, max_pending_requests=server.max_pending_requests)
        connector = build_kv_connector(settings)
        try:
            app = create_role_app(server.role, llm, connector, kv_transfer_timeout_s=server.kv_transfer_timeout_s)
            host, port = listening.getsockname()[:2]
            print(f"hetero: {server.role} role of {settings.model} on http://{host}:{port}", file=sys.stderr, flush=True)
            runner = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5))
            runner.run(sockets=[listening])
            return runner.should_exit
        finally:
            connector.close()
            llm.shutdown()


def serve_disaggregated(settings, server, argv: list[str], log_level: str = "info") -> bool:
    """Both roles as children, the front end here, until stopped; True if a signal stopped it."""
    child_argv = _engine_argv(argv)
    children = {}
    try:
        urls = {}
        for role in ("prefill", "decode"):
            port = _free_port()
            children[role] = subprocess.Popen([sys.executable, "-m", "hetero_core", "serve", *child_argv, "--role", role,
                                               "--host", "127.0.0.1", "--port", str(port)], env=os.environ.copy())
            urls[role] = f"http://127.0.0.1:{port}"
        for role, url in urls.items():
            _wait_ready(role, url, children[role])
        return serve_frontend(settings, server, urls["prefill"], urls["decode"], log_level)
    finally:
        for child in children.values():
            _stop(child)


def serve_frontend(settings, server, prefill_url: str, decode_url: str, log_level: str = "info") -> bool:
    """The OpenAI front end over running roles (here or on other machines) until stopped; True if a
    signal stopped it."""
    with listen(server.host, server.port) as listening:
        try:
            client = DisaggregatedClient(prefill_url, decode_url, timeout_s=server.kv_transfer_timeout_s)
        except httpx.HTTPError as exc:
            raise ConfigError(f"the decode role at {decode_url} did not answer /disagg/info ({exc}); start it "
                              "first, or check --decode-url") from None
        app = create_frontend_app(client, model_name=server.served_model_name or settings.model,
                                  api_key=server.key(), max_body_bytes=server.max_body_bytes,
                                  max_pending_choices=server.max_pending_requests)
        return run_server(app, server, listening, log_level=log_level)


def _engine_argv(argv: list[str]) -> list[str]:
    """``argv`` (the flags after ``serve``) without the flags the launcher sets for its children."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _OWN_FLAGS or any(arg.startswith(f + "=") for f in _OWN_FLAGS_WITH_VALUE):
            continue
        elif arg in _OWN_FLAGS_WITH_VALUE:
            skip = True
        else:
            out.append(arg)
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(role: str, url: str, child: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise ConfigError(f"the {role} engine process exited with status {child.returncode} before it was "
                              "ready; its output above says why")
        try:
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise ConfigError(f"the {role} engine did not answer {url}/health within {START_TIMEOUT_S:.0f}s")


def _stop(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
