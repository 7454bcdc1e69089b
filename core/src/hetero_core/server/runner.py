"""Build the app from settings and run it under uvicorn (what ``hetero serve`` does)."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time

import uvicorn
from fastapi import FastAPI

from hetero_core.async_llm import AsyncLLM
from hetero_core.errors import ConfigError
from hetero_core.logging import get_logger
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.server.app import create_app
from hetero_core.server.metrics import EngineMetrics
from hetero_core.server.settings import ServerSettings

log = get_logger("hetero.server")
# After the drain, uvicorn's own grace for responses to write their last events.
FINAL_WRITE_SECONDS = 5.0


def create_server_app(settings, server: ServerSettings) -> FastAPI:
    """Engine + AsyncLLM + app; the engine loop stops when the app shuts down."""
    engine_metrics = EngineMetrics()
    llm = AsyncLLM.from_settings(
        settings, max_pending_requests=server.max_pending_requests, observer=engine_metrics
    )
    model_name, serving = served_model(settings, server)
    app = create_app(
        llm,
        model_name=model_name,
        api_key=server.key(),
        max_body_bytes=server.max_body_bytes,
        engine_metrics=engine_metrics,
        shutdown_llm=True,
        max_pending_choices=server.max_pending_requests,
        chat_page=server.chat_page,
    )
    app.state.serving = serving  # what the ready line says is served
    return app


def served_model(settings, server: ServerSettings) -> tuple[str, str]:
    """The model id clients see (``/v1/models``, each response's ``model``) and what the ready line says
    is served: ``--served-model-name``, else the model; for an executor that runs none (registered
    with ``needs_model=False``: mock), its name and ``the mock executor (no model)``, never a model it
    did not load."""
    if server.served_model_name:
        return server.served_model_name, server.served_model_name
    executor = settings.component_name("executor")
    if load_plugins(allow=settings.plugins).registry.get("executor", executor).traits.get("needs_model"):
        return settings.model, settings.model
    return executor, f"the {executor} executor (no model)"


class GracefulServer(uvicorn.Server):
    """On stop: refuse new connections, let requests finish for ``drain_seconds``, then abort the rest
    (``llm.shutdown()``: streams end with an error event and ``[DONE]``) before uvicorn closes connections.
    Every serve mode stops through it: ``llm`` is an ``AsyncLLM``, a role's, or the disaggregated front
    end's client (whose ``shutdown`` aborts the requests it relays). ``stop``: an event that stops it as
    a signal would, without ``interrupted`` (the disaggregated launcher's, when a role is given up)."""

    def __init__(
        self,
        config: uvicorn.Config,
        llm,
        drain_seconds: float,
        on_ready=None,
        stop: threading.Event | None = None,
    ) -> None:
        super().__init__(config)
        self.llm, self.drain_seconds = llm, drain_seconds
        self.on_ready = on_ready  # called once, when the server accepts connections
        self.stop = stop
        self.interrupted = False  # stopped by SIGINT/SIGTERM (hetero serve then exits 130)

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started and self.on_ready is not None:
            self.on_ready()

    def handle_exit(self, sig, frame) -> None:
        self.interrupted = True
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        return await super().on_tick(counter) or (self.stop is not None and self.stop.is_set())

    async def shutdown(self, sockets=None) -> None:
        for server in self.servers:
            server.close()
        deadline = time.monotonic() + self.drain_seconds
        while self.llm.stats.num_pending and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.llm.stats.num_pending:
            log.warning("server.aborting_requests", num_pending=self.llm.stats.num_pending)
        await asyncio.get_running_loop().run_in_executor(None, self.llm.shutdown)
        await super().shutdown(sockets)


def make_uvicorn_server(
    app: FastAPI,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    drain_seconds: float = 30.0,
    log_level: str = "info",
    on_ready=None,
    llm=None,
    stop: threading.Event | None = None,
) -> GracefulServer:
    """``llm``: what the drain waits for and the stop aborts (default: the OpenAI app's,
    ``app.state.hetero.llm``)."""
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=FINAL_WRITE_SECONDS
    )
    llm = llm if llm is not None else app.state.hetero.llm
    return GracefulServer(config, llm, drain_seconds, on_ready, stop)


def ready_line(model_name: str, listening: socket.socket) -> str:
    """``hetero: serving NAME on http://HOST:PORT (OpenAI API at /v1)``, with the port actually bound;
    ``model_name``: what is served (``served_model``)."""
    host, port = listening.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    return f"hetero: serving {model_name} on http://{host}:{port} (OpenAI API at /v1)"


def run_server(
    app: FastAPI,
    server: ServerSettings,
    listening: socket.socket,
    log_level: str = "info",
    *,
    line: str | None = None,
    llm=None,
    stop: threading.Event | None = None,
    on_ready=None,
) -> bool:
    """Serve on ``listening`` (from ``listen``) until stopped: Ctrl-C or SIGTERM (inside
    ``signals.sigterm_interrupts``) raise KeyboardInterrupt once the server has shut down; True if a
    signal stopped it without raising. ``line``: printed once it accepts connections (default:
    ``ready_line``), then ``on_ready()`` is called, if given; ``llm`` and ``stop``: as
    ``make_uvicorn_server``'s."""
    line = line or ready_line(getattr(app.state, "serving", app.state.hetero.model_name), listening)

    def ready() -> None:
        print(line, file=sys.stderr, flush=True)
        if on_ready is not None:
            on_ready()

    runner = make_uvicorn_server(
        app,
        host=server.host,
        port=server.port,
        drain_seconds=server.graceful_shutdown_seconds,
        log_level=log_level,
        on_ready=ready,
        llm=llm,
        stop=stop,
    )
    runner.run(sockets=[listening])
    return runner.interrupted


def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the engine loads, so that an address in use or not available
    is a one-line error at once (``hetero serve`` exits 2), not uvicorn's log line and exit 3 later."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; check --host") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port "
            "or --host, or stop what uses it"
        ) from None
    return sock
