"""The FastAPI app: routers per endpoint group, the guards (errors, API key, body limit), the schema."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from hetero_core.async_llm import DEFAULT_MAX_PENDING_REQUESTS, AsyncLLM
from hetero_core.openai_api.protocol import ChatCompletionChunk, ChatCompletionRequest, CompletionRequest
from hetero_core.openai_api.responses_output import ResponseStreamEvent
from hetero_core.openai_api.responses_protocol import ResponsesRequest
from hetero_core.openai_api.token_protocol import DetokenizeRequest, TokenizeRequest
from hetero_core.server import chat, completions, metrics, models, page, responses, tokens
from hetero_core.server.choices import ChoiceBudget
from hetero_core.server.errors import install_error_handlers
from hetero_core.server.limits import DEFAULT_MAX_BODY_BYTES, PUBLIC_PATHS, ApiKeyGuard, BodySizeLimit
from hetero_core.server.metrics import EngineMetrics
from hetero_core.server.openapi import install_openapi
from hetero_core.server.state import ServerState

TITLE = "Hetero"
ROUTERS = (
    completions.router,
    chat.router,
    responses.router,
    models.router,
    models.health_router,
    metrics.router,
    tokens.router,
)


def create_app(
    llm: AsyncLLM,
    *,
    model_name: str,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    engine_metrics: EngineMetrics | None = None,
    shutdown_llm: bool = False,
    max_pending_choices: int = DEFAULT_MAX_PENDING_REQUESTS,
    chat_page: bool = True,
) -> FastAPI:
    """An OpenAI-compatible app over ``llm``. ``engine_metrics`` must be ``llm``'s observer to get
    counters and histograms (``serve_llm`` wires both); gauges come from ``llm.stats`` either way.
    ``max_pending_choices``: choices (prompts x n) the app runs at once (``choices.py``). ``chat_page``:
    serve the chat page at ``/`` (``page.py``), which needs no key; the API it calls still does.

    A request meets, in order: the error guard (anything unhandled becomes a 500 in OpenAI's error
    JSON), the API key (from the headers alone; every path but /health, /metrics and the chat page's,
    /openapi.json included), the body size limit, then its route."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        if shutdown_llm:
            llm.shutdown()

    app = FastAPI(title=TITLE, lifespan=lifespan, docs_url=None, redoc_url=None)
    engine = llm.engine
    app.state.hetero = ServerState(
        llm=llm,
        model_name=model_name,
        max_model_len=engine.max_model_len,
        default_params=engine.default_params,
        choices=ChoiceBudget(max_pending_choices),
    )
    app.state.metrics = engine_metrics or EngineMetrics()
    app.state.metrics.watch(llm)
    _add_routes(app, has_api_key=bool(api_key))
    if chat_page:
        app.include_router(page.router)
    public_paths = PUBLIC_PATHS | page.PAGE_PATHS if chat_page else PUBLIC_PATHS
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)  # the last added runs first
    app.add_middleware(ApiKeyGuard, api_key=api_key, public_paths=public_paths)
    install_error_handlers(app)
    return app


def openapi_schema(*, has_api_key: bool) -> dict:
    """The schema ``/openapi.json`` serves, without an engine (what the fuzz tests generate requests from)."""
    app = FastAPI(title=TITLE)
    _add_routes(app, has_api_key=has_api_key)
    return app.openapi()


def _add_routes(app: FastAPI, *, has_api_key: bool) -> None:
    for router in ROUTERS:
        app.include_router(router)
    install_openapi(
        app,
        [
            CompletionRequest,
            ChatCompletionRequest,
            ChatCompletionChunk,
            TokenizeRequest,
            DetokenizeRequest,
            ResponsesRequest,
            ResponseStreamEvent,
        ],
        public_paths=PUBLIC_PATHS,
        has_api_key=has_api_key,
    )
