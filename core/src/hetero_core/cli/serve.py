"""``hetero serve``: the OpenAI-compatible server. Engine settings as for ``hetero run``, plus server
flags."""

from __future__ import annotations

import argparse
import sys

from hetero_core.cli.settings_args import (
    add_reuse_server_argument,
    add_settings_arguments,
    load_cli_settings,
)
from hetero_core.errors import HeteroError


def add_serve_command(commands, with_arguments: bool = True) -> None:
    """Register ``serve`` on the ``hetero`` sub-command parser (``with_arguments``: and its flags)."""
    serve = commands.add_parser(
        "serve", help="serve the OpenAI-compatible HTTP API (needs hetero-core[server])"
    )
    serve.set_defaults(handler=_serve)
    if with_arguments:
        _add_serve_arguments(serve)


def _add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    from hetero_core.server.settings import ServerSettings

    group = serve.add_argument_group("server (override HETERO_HOST, HETERO_PORT, HETERO_API_KEY, ...)")
    fields = ServerSettings.model_fields
    group.add_argument("--host", help=fields["host"].description + " [127.0.0.1]")
    group.add_argument("--port", type=int, help=fields["port"].description + " [8000]")
    group.add_argument("--api-key", metavar="KEY", help=fields["api_key"].description)
    group.add_argument("--served-model-name", metavar="NAME", help=fields["served_model_name"].description)
    group.add_argument(
        "--max-pending-requests", type=int, metavar="N", help=fields["max_pending_requests"].description
    )
    group.add_argument("--max-body-bytes", type=int, metavar="N", help=fields["max_body_bytes"].description)
    group.add_argument(
        "--no-chat-page",
        dest="chat_page",
        action="store_false",
        default=None,
        help="leave out the chat page at / (GET / is then 404, as any unknown path; "
        "HETERO_CHAT_PAGE=false does the same)",
    )
    group.add_argument(
        "--graceful-shutdown-seconds",
        type=float,
        metavar="S",
        help=fields["graceful_shutdown_seconds"].description,
    )
    disagg = serve.add_argument_group(
        "prefill/decode disaggregation (docs/disaggregation.md; override HETERO_ROLE, ...)"
    )
    disagg.add_argument(
        "--role", choices=("both", "prefill", "decode"), help=fields["role"].description + " [both]"
    )
    disagg.add_argument(
        "--disaggregated", action="store_true", default=None, help=fields["disaggregated"].description
    )
    disagg.add_argument("--prefill-url", metavar="URL", help=fields["prefill_url"].description)
    disagg.add_argument("--decode-url", metavar="URL", help=fields["decode_url"].description)
    disagg.add_argument(
        "--kv-transfer-timeout",
        type=float,
        metavar="S",
        dest="kv_transfer_timeout_s",
        help=fields["kv_transfer_timeout_s"].description + " [30]",
    )
    disagg.add_argument(
        "--role-restart-retries",
        type=int,
        metavar="N",
        help=fields["role_restart_retries"].description + " [3]",
    )
    disagg.add_argument(
        "--role-restart-backoff-seconds",
        type=float,
        metavar="S",
        help=fields["role_restart_backoff_seconds"].description + " [1]",
    )
    ray = serve.add_argument_group(
        "replicas on Ray Serve (needs hetero-core[ray]; override HETERO_REPLICAS, ...)"
    )
    ray.add_argument("--replicas", type=int, metavar="N", help=fields["replicas"].description + " [1]")
    ray.add_argument("--ray-address", metavar="ADDR", help=fields["ray_address"].description)
    ray.add_argument(
        "--replica-cpus", type=float, metavar="N", help=fields["replica_cpus"].description + " [1]"
    )
    ray.add_argument(
        "--replica-gpus", type=float, metavar="N", help=fields["replica_gpus"].description + " [0]"
    )
    add_reuse_server_argument(
        serve, "record this server in the cache dir so that hetero run sends it its prompts"
    )
    add_settings_arguments(serve)


def _serve(args: argparse.Namespace) -> int:
    from hetero_core.logging import configure_logging

    try:
        import httpx  # noqa: F401  (the disaggregated front end's client; checked with the rest of the extra)

        from hetero_core.server.runner import create_server_app, listen, run_server
        from hetero_core.server.signals import sigterm_interrupts
    except ImportError as exc:
        from hetero_core.server import SERVER_EXTRA_HINT

        raise HeteroError(f"{SERVER_EXTRA_HINT} (missing: {exc.name})") from None
    from hetero_core.cli.serve_record import recorded_while_serving
    from hetero_core.server.settings import load_server_settings

    settings = load_cli_settings(args)
    server = load_server_settings(
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        served_model_name=args.served_model_name,
        max_pending_requests=args.max_pending_requests,
        max_body_bytes=args.max_body_bytes,
        chat_page=args.chat_page,
        graceful_shutdown_seconds=args.graceful_shutdown_seconds,
        replicas=args.replicas,
        ray_address=args.ray_address,
        replica_cpus=args.replica_cpus,
        replica_gpus=args.replica_gpus,
        role=args.role,
        disaggregated=args.disaggregated,
        kv_transfer_timeout_s=args.kv_transfer_timeout_s,
        prefill_url=args.prefill_url,
        decode_url=args.decode_url,
        role_restart_retries=args.role_restart_retries,
        role_restart_backoff_seconds=args.role_restart_backoff_seconds,
    )
    configure_logging(settings.log_format, settings.log_level)
    _say_if_structured_output_is_off(settings)
    with sigterm_interrupts():  # SIGTERM stops every mode as Ctrl-C does: cleanly, then exit 130
        if server.role != "both" or server.disaggregated or server.prefill_url:
            from hetero_core.disagg.launcher import serve_disaggregated, serve_frontend, serve_role

            if server.prefill_url:
                return (
                    130
                    if serve_frontend(
                        settings, server, server.prefill_url, server.decode_url, settings.log_level
                    )
                    else 0
                )
            if server.role != "both":
                return 130 if serve_role(settings, server, settings.log_level) else 0
            return 130 if serve_disaggregated(settings, server, _serve_argv(), settings.log_level) else 0
        if server.uses_ray and not _ray_runs_only_the_ranks(settings, server):
            _serve_replicas(settings, server)  # until Ctrl-C or SIGTERM, which raise KeyboardInterrupt
            return 130
        with listen(
            server.host, server.port
        ) as listening:  # before the engine loads: a port in use fails at once
            app = create_server_app(settings, server)
            with recorded_while_serving(settings, server, app, listening) as record:
                interrupted = run_server(
                    app, server, listening, log_level=settings.log_level, on_ready=record
                )
    return 130 if interrupted else 0  # the shell's convention for Ctrl-C, also after a clean shutdown


def _say_if_structured_output_is_off(settings) -> None:
    """One line at start when the chosen structured-output backend is core's xgrammar and xgrammar is
    not installed: what is off and the command that turns it on (the [server] extra leaves it out, since
    xgrammar needs torch and would pull PyPI's CUDA build into a torch-less install)."""
    import importlib.util

    if (
        settings.component_name("structured_output") == "xgrammar"
        and importlib.util.find_spec("xgrammar") is None
    ):
        print(
            "hetero: structured output is off (response_format json_schema/json_object, guided_*, "
            'tool_choice "required" or a named tool answer 400): '
            "pip install 'hetero-core[structured]' to turn it on",
            file=sys.stderr,
            flush=True,
        )


def _serve_argv() -> list[str]:
    """The flags after ``serve`` on this process's command line (what the disaggregated launcher hands
    its role processes, less the flags it sets itself)."""
    argv = sys.argv[1:]
    return argv[argv.index("serve") + 1 :] if "serve" in argv else argv


def _ray_runs_only_the_ranks(settings, server) -> bool:
    """One engine whose ranks run on Ray (``--distributed-executor-backend ray``): ``--ray-address`` is
    their cluster, and this process serves as without Ray (no Ray Serve replica around it)."""
    return settings.distributed_executor_backend == "ray" and server.replicas == 1


def _serve_replicas(settings, server) -> None:
    try:
        from hetero_core.replicas.launcher import serve_replicas
    except ImportError as exc:
        from hetero_core.replicas import RAY_EXTRA_HINT

        raise HeteroError(f"{RAY_EXTRA_HINT} (missing: {exc.name})") from None
    serve_replicas(settings, server)
