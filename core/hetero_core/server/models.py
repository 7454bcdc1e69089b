"""GET /v1/models and GET /health."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from hetero_core.server.openapi import errors
from hetero_core.openai_api.protocol import Health, ModelCard, ModelList
from hetero_core.server.state import get_state

router = APIRouter()
health_router = APIRouter()


@router.get("/v1/models", responses=errors(401))
async def list_models(request: Request) -> ModelList:
    state = get_state(request)
    return ModelList(data=[ModelCard(id=state.model_name, max_model_len=state.max_model_len)])


@health_router.get("/health", response_model=Health,
                   responses={503: {"model": Health, "description": "the engine loop has stopped"}})
async def health(request: Request) -> JSONResponse:
    """200 while the engine loop serves; 503 with the reason once it has stopped."""
    llm = get_state(request).llm
    if llm.is_running:
        return JSONResponse({"status": "ok"})
    return JSONResponse({"status": "unavailable", "reason": llm.dead_reason or "shut down"}, 503)
