"""The FastAPI app: routers per endpoint group, the body limit, the API key, the error handler."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from fastapi.responses import Response

from hetero_core.async_llm import AsyncLLM
from hetero_core.server import chat, completions, metrics, models
from hetero_core.server.errors import install_error_handlers
from hetero_core.server.generation import ClientDisconnected
from hetero_core.server.limits import DEFAULT_MAX_BODY_BYTES, BodySizeLimit, require_api_key
from hetero_core.server.metrics import EngineMetrics
from hetero_core.server.state import ServerState


def create_app(llm: AsyncLLM, *, model_name: str, api_key: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, engine_metrics: EngineMetrics | None = None,
               shutdown_llm: bool = False) -> FastAPI:
    """An OpenAI-compatible app over ``llm``. ``engine_metrics`` must be ``llm``'s observer to get
    counters and histograms (``serve_llm`` wires both); gauges come from ``llm.stats`` either way."""
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        if shutdown_llm:
            llm.shutdown()

    app = FastAPI(title="Hetero", lifespan=lifespan, docs_url=None, redoc_url=None)
    engine = llm.engine
    app.state.hetero = ServerState(llm=llm, model_name=model_name, max_model_len=engine.max_model_len,
                                   default_params=engine.default_params, api_key=api_key)
    app.state.metrics = engine_metrics or EngineMetrics()
    app.state.metrics.watch(llm)
    install_error_handlers(app)

    @app.exception_handler(ClientDisconnected)
    async def _gone(request, exc):  # nobody reads this; nginx's "client closed request"
        return Response(status_code=499)

    authorized = [Depends(require_api_key)]
    app.include_router(completions.router, dependencies=authorized)
    app.include_router(chat.router, dependencies=authorized)
    app.include_router(models.router, dependencies=authorized)
    app.include_router(models.health_router)
    app.include_router(metrics.router)
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    return app

