"""Frontend: the HTTP ingress deployment. It serves ``hetero_core.server``'s OpenAI app, built by the same
``create_app`` as the single-process server, over a ``ReplicaClient`` instead of an ``AsyncLLM``; every
response names the replicas that served it in the ``x-hetero-replica`` header."""

from __future__ import annotations

from hetero_core.replicas.client import ReplicaClient, served_by
from hetero_core.replicas.metrics import ReplicaMetrics
from hetero_core.server.app import create_app

REPLICA_HEADER = "x-hetero-replica"


class Frontend:
    def __init__(
        self,
        engine_handle,
        *,
        model_name: str,
        api_key: str | None,
        max_body_bytes: int,
        max_pending_choices: int,
        chat_page: bool = True,
    ) -> None:
        self.engine_handle = engine_handle
        self.app_options = {
            "model_name": model_name,
            "api_key": api_key,
            "max_body_bytes": max_body_bytes,
            "max_pending_choices": max_pending_choices,
            "chat_page": chat_page,
        }

    async def __serve_build_asgi_app__(self):
        """Called by Ray Serve once the replica is constructed (``@serve.ingress()`` without an app)."""
        engine_info = await self.engine_handle.engine_info.remote()
        client = ReplicaClient(self.engine_handle, engine_info)
        app = create_app(client, engine_metrics=ReplicaMetrics(), shutdown_llm=True, **self.app_options)
        app.add_middleware(ReplicaHeader)
        return app


class ReplicaHeader:
    """ASGI middleware: collects the replicas a request's choices ran on (``served_by``) and sends them as
    ``x-hetero-replica: id[,id...]`` with the response headers (which go out after every choice started)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        replicas: list[str] = []
        token = served_by.set(replicas)

        async def send_with_header(message) -> None:
            if message["type"] == "http.response.start" and replicas:
                headers = [
                    *message.get("headers", []),
                    (REPLICA_HEADER.encode(), ",".join(replicas).encode()),
                ]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_header)
        finally:
            served_by.reset(token)
