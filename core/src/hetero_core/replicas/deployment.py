"""The Ray Serve application: ``replicas`` x ``EngineReplica`` behind one ``Frontend``.

    from ray import serve
    from hetero_core.replicas.deployment import build_application
    serve.run(build_application(settings, server_settings), name="hetero", route_prefix="/")

or with Ray Serve's own tools (``serve run``, a Serve config file's ``import_path`` on KubeRay):

    serve run hetero_core.replicas.deployment:app_builder executor=mock replicas=2 max_tokens=64

Every HTTP request reaches the Frontend (the same OpenAI app as ``hetero serve``); each engine request
goes from there through a deployment handle to the replica ``FewestQueuedTokensRouter`` picks. Ray
Serve's controller health-checks the replicas (``EngineReplica.check_health``) and replaces one that
died or whose engine stopped, while the others keep serving.
"""

from __future__ import annotations

from pydantic import ValidationError
from ray import serve
from ray.serve.config import RequestRouterConfig

from hetero_core.errors import ConfigError
from hetero_core.replicas.engine_replica import EngineReplica
from hetero_core.replicas.frontend import Frontend
from hetero_core.replicas.router import FewestQueuedTokensRouter
from hetero_core.server.settings import ServerSettings
from hetero_core.settings import load_settings
from hetero_core.validation import describe_validation_error

# How often each replica reports its queued tokens to the routers (Ray Serve's default is 10 s).
ROUTING_STATS_PERIOD_S = 1.0
HEALTH_CHECK_PERIOD_S = 2.0
# A replica whose constructor fails this many times fails the deployment (a wrong setting fails fast).
MAX_CONSTRUCTOR_RETRIES = 3
# At shutdown the frontend outlives the engine replicas' drain by this much, so that a request still
# running when they stop ends with an error event (ReplicaLostError) instead of a cut connection.
FRONTEND_FINAL_WRITE_S = 5.0


def build_application(settings, server: ServerSettings):
    """The bound application for ``serve.run``; ``settings`` are the engine's (HeteroSettings)."""
    log_level = settings.log_level.upper()
    engine = serve.deployment(
        EngineReplica,
        name="EngineReplica",
        num_replicas=server.replicas,
        ray_actor_options={"num_cpus": server.replica_cpus, "num_gpus": server.replica_gpus},
        # Each replica takes as many requests as its AsyncLLM accepts; beyond that they queue in the
        # frontend's router, up to the same number again, then get a 429.
        max_ongoing_requests=server.max_pending_requests,
        max_queued_requests=server.max_pending_requests,
        request_router_config=RequestRouterConfig(
            request_router_class=FewestQueuedTokensRouter,
            request_routing_stats_period_s=ROUTING_STATS_PERIOD_S,
        ),
        health_check_period_s=HEALTH_CHECK_PERIOD_S,
        graceful_shutdown_timeout_s=server.graceful_shutdown_seconds,
        max_constructor_retry_count=MAX_CONSTRUCTOR_RETRIES,
        logging_config={"log_level": log_level},
    ).bind(_replica_settings(settings), server.max_pending_requests)
    frontend = serve.deployment(
        serve.ingress()(Frontend),
        name="Frontend",
        num_replicas=1,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=2 * server.replicas * server.max_pending_requests,
        graceful_shutdown_timeout_s=server.graceful_shutdown_seconds + FRONTEND_FINAL_WRITE_S,
        max_constructor_retry_count=MAX_CONSTRUCTOR_RETRIES,
        logging_config={"log_level": log_level, "enable_access_log": False},
    )
    return frontend.bind(
        engine,
        model_name=server.served_model_name or settings.model,
        api_key=server.key(),
        max_body_bytes=server.max_body_bytes,
        max_pending_choices=server.replicas * server.max_pending_requests,
        chat_page=server.chat_page,
    )


def _replica_settings(settings):
    """A replica's engine settings: without ``ray_address`` (the replicas' cluster, which the replica
    already runs on; its ranks, with distributed_executor_backend 'ray', use the same connection)."""
    return settings.model_copy(update={"ray_address": None})


def app_builder(args: dict[str, str]):
    """The application from ``key=value`` arguments (Ray Serve's application builder): engine setting names
    as for ``hetero run`` and the server's (``replicas``, ``replica_cpus``, ``api_key``, ...). Serve's own
    HTTP options apply, not ``host`` / ``port``; ``HETERO_*`` variables of the deploying process count."""
    server_names = set(ServerSettings.model_fields)
    settings = load_settings(**{k: v for k, v in args.items() if k not in server_names})
    try:
        server = ServerSettings(**{k: v for k, v in args.items() if k in server_names})
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, "server settings")) from None
    return build_application(settings, server)
