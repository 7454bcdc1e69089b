"""The disaggregated front end: the OpenAI app (``server.app.create_app``, the single-process server's
routes) over a ``DisaggregatedClient``. Every response of a generation says how its time to first
token split, per choice: ``x-hetero-kv-transfer: prefill=0.1234;transfer=0.0012`` (seconds; several
choices comma-separated)."""

from __future__ import annotations

from fastapi import FastAPI

from hetero_core.disagg.client import DisaggregatedClient, request_timings
from hetero_core.disagg.metrics import DisaggregatedMetrics
from hetero_core.server.app import create_app

TIMINGS_HEADER = "x-hetero-kv-transfer"


def create_frontend_app(client: DisaggregatedClient, *, model_name: str, **app_options) -> FastAPI:
    app = create_app(
        client, model_name=model_name, engine_metrics=DisaggregatedMetrics(), shutdown_llm=True, **app_options
    )
    app.add_middleware(TimingsHeader)
    return app


class TimingsHeader:
    """ASGI middleware: the KV transfer timings the client collected (``request_timings``) as a header
    of the response (which goes out once every choice has its first token)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        timings: list[dict] = []
        token = request_timings.set(timings)

        async def send_with_header(message) -> None:
            if message["type"] == "http.response.start" and timings:
                value = ",".join(
                    f"prefill={t['prefill_s']:.4f};transfer={t['transfer_s']:.4f}" for t in timings
                )
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (TIMINGS_HEADER.encode(), value.encode())],
                }
            await send(message)

        try:
            await self.app(scope, receive, send_with_header)
        finally:
            request_timings.reset(token)
