"""``hetero serve --role prefill|decode`` (one role's server), ``hetero serve --prefill-url URL --decode-url
URL`` (the front end alone, over roles that may run on other machines) and ``hetero serve --disaggregated``: a
prefill and a decode engine as child processes (``supervisor.RoleProcesses``: ``hetero serve --role ...``
with the same engine flags, on free loopback ports, restarted when one dies) and the OpenAI front end in
this process. Every mode stops as plain mode does (``server.runner.GracefulServer``): running requests get
``graceful_shutdown_seconds``, the rest are aborted (a stream ends with an error event and ``[DONE]``);
under ``--disaggregated`` the front end stops first, then its children."""

from __future__ import annotations

import httpx

from hetero_core.async_llm import AsyncLLM
from hetero_core.async_llm.errors import EngineDeadError
from hetero_core.builder import build_kv_connector
from hetero_core.disagg.client import DisaggregatedClient
from hetero_core.disagg.frontend import create_frontend_app
from hetero_core.disagg.role_apps import create_role_app
from hetero_core.disagg.supervisor import RoleProcesses, stop_with_launcher
from hetero_core.errors import ConfigError
from hetero_core.server.runner import listen, run_server, served_model

# flags of ``hetero serve`` that the launcher sets itself for its children (with a value, or without)
_OWN_FLAGS_WITH_VALUE = (
    "--port",
    "--host",
    "--role",
    "--prefill-url",
    "--decode-url",
    "--role-restart-retries",
    "--role-restart-backoff-seconds",
)
_OWN_FLAGS = ("--disaggregated",)


def serve_role(settings, server, log_level: str = "info") -> bool:
    """Serve ``server.role`` until stopped; True if a signal stopped it."""
    stop_with_launcher()
    with listen(server.host, server.port) as listening:
        llm = AsyncLLM.from_settings(settings, max_pending_requests=server.max_pending_requests)
        connector = build_kv_connector(settings)
        try:
            app = create_role_app(
                server.role, llm, connector, kv_transfer_timeout_s=server.kv_transfer_timeout_s
            )
            host, port = listening.getsockname()[:2]
            serving = served_model(settings, server)[1]
            line = f"hetero: {server.role} role of {serving} on http://{host}:{port}"
            return run_server(app, server, listening, log_level, line=line, llm=llm)
        finally:
            connector.close()
            llm.shutdown()


def serve_disaggregated(settings, server, argv: list[str], log_level: str = "info") -> bool:
    """Both roles as children, the front end here, until stopped; True if a signal stopped it. A role
    that cannot be restarted stops the front end and raises ``EngineDeadError`` naming it."""
    roles = RoleProcesses(
        _engine_argv(argv), retries=server.role_restart_retries, backoff_s=server.role_restart_backoff_seconds
    )
    try:
        urls = roles.start()
        interrupted = serve_frontend(
            settings, server, urls["prefill"], urls["decode"], log_level, stop=roles.stop
        )
    finally:
        roles.close()
    if roles.failure and not interrupted:
        raise EngineDeadError(roles.failure)
    return interrupted


def serve_frontend(
    settings, server, prefill_url: str, decode_url: str, log_level: str = "info", stop=None
) -> bool:
    """The OpenAI front end over running roles (here or on other machines) until stopped (a signal, or
    the ``stop`` event); True if a signal stopped it."""
    with listen(server.host, server.port) as listening:
        try:
            client = DisaggregatedClient(prefill_url, decode_url, timeout_s=server.kv_transfer_timeout_s)
        except httpx.HTTPError as exc:
            raise ConfigError(
                f"the decode role at {decode_url} did not answer /disagg/info ({exc}); start it "
                "first, or check --decode-url"
            ) from None
        app = create_frontend_app(
            client,
            model_name=served_model(settings, server)[0],
            api_key=server.key(),
            max_body_bytes=server.max_body_bytes,
            max_pending_choices=server.max_pending_requests,
            chat_page=server.chat_page,
        )
        return run_server(app, server, listening, log_level=log_level, stop=stop)


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
