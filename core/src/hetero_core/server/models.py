"""GET /v1/models, /v1/models/{model_id}, /version and /health."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from hetero_core import __version__
from hetero_core.openai_api.protocol import Health, ModelCard, ModelList
from hetero_core.openai_api.token_protocol import VersionResponse
from hetero_core.server.openapi import errors
from hetero_core.server.state import get_state

router = APIRouter()
health_router = APIRouter()


@router.get("/v1/models", responses=errors(401))
async def list_models(request: Request) -> ModelList:
    state = get_state(request)
    return ModelList(data=[ModelCard(id=state.model_name, max_model_len=state.max_model_len)])


@router.get("/v1/models/{model_id:path}", responses=errors(401, 404))
async def retrieve_model(request: Request, model_id: str) -> ModelCard:
    """The served model's card; 404 (OpenAI's error JSON) for any other id."""
    state = get_state(request)
    state.check_model(model_id)
    return ModelCard(id=state.model_name, max_model_len=state.max_model_len)


@router.get("/version", responses=errors(401))
async def version() -> VersionResponse:
    return VersionResponse(version=__version__)


@health_router.get(
    "/health",
    response_model=Health,
    responses={503: {"model": Health, "description": "the engine loop has stopped"}},
)
async def health(request: Request) -> JSONResponse:
    """200 while the engine loop serves; 503 with the reason once it has stopped."""
    llm = get_state(request).llm
    if llm.is_running:
        return JSONResponse({"status": "ok"})
    return JSONResponse({"status": "unavailable", "reason": llm.dead_reason or "shut down"}, 503)
