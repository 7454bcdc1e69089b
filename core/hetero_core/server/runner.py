"""Build the app from settings and run it under uvicorn (what ``hetero serve`` does)."""

from __future__ import annotations

from fastapi import FastAPI

from hetero_core.async_llm import AsyncLLM
from hetero_core.server.app import create_app
from hetero_core.server.metrics import EngineMetrics
from hetero_core.server.settings import ServerSettings


def create_server_app(settings, server: ServerSettings) -> FastAPI:
    """Engine + AsyncLLM + app; the engine loop stops when the app shuts down."""
    engine_metrics = EngineMetrics()
    llm = AsyncLLM.from_settings(settings, max_pending_requests=server.max_pending_requests,
                                 observer=engine_metrics)
    return create_app(llm, model_name=server.served_model_name or settings.model, api_key=server.key(),
                      max_body_bytes=server.max_body_bytes, engine_metrics=engine_metrics, shutdown_llm=True)


def run_server(app: FastAPI, server: ServerSettings, log_level: str = "info") -> None:
    import uvicorn

    uvicorn.run(app, host=server.host, port=server.port, log_level=log_level,
                timeout_graceful_shutdown=server.graceful_shutdown_seconds)
