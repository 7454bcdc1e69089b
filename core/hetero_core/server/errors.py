"""One place that turns errors into OpenAI's error JSON: {"error": {message, type, param, code}}."""

from __future__ import annotations

import json

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from hetero_core.async_llm import (
    EngineDeadError,
    EngineOverloadedError,
    EngineStepError,
    RequestFailedError,
)
from hetero_core.errors import HeteroError, InvalidRequestError
from hetero_core.logging import get_logger

log = get_logger("hetero.server")


class APIError(Exception):
    """An error answered with ``status`` and OpenAI's error body."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(error: APIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    return JSONResponse(error_body(error.message, error.type, error.param, error.code), error.status,
                        headers=headers)


def to_api_error(exc: Exception) -> APIError:
    """Our exceptions as API errors (used for streams too, where the status is already sent)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, EngineStepError):
        return APIError(500, str(exc), "server_error", code="engine_step_failed")
    if isinstance(exc, InvalidRequestError | RequestFailedError):
        return APIError(400, str(exc), code="invalid_request")
    if isinstance(exc, EngineOverloadedError):
        return APIError(429, str(exc), "rate_limit_error", code="too_many_pending_requests")
    if isinstance(exc, EngineDeadError):
        return APIError(503, str(exc), "server_error", code="engine_unavailable")
    log.error("server.internal_error", error=repr(exc))
    return APIError(500, f"internal server error: {type(exc).__name__}: {exc}", "server_error")


async def parse_body(request: Request, model: type[BaseModel]):
    """The JSON body as ``model`` (whatever the Content-Type says); 400 naming the field if not."""
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(data).__name__}",
                       code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise describe_validation(RequestValidationError(exc.errors())) from None


def describe_validation(exc: RequestValidationError) -> APIError:
    """A 400 naming the first bad field (``messages.0.role: ...``) and listing the others."""
    problems: dict[str, str] = {}
    param = None
    for error in exc.errors():
        loc = [str(p) for p in error.get("loc", ()) if p != "body"]
        if error.get("type") == "json_invalid":
            return APIError(400, f"the request body is not valid JSON: {error.get('msg')}", code="invalid_json")
        # Drop pydantic's union branch names ("str", "list[int]") from the location.
        loc = [p for p in loc if not any(c in p for c in "[]") and p not in ("str", "int", "float", "bool")]
        field = ".".join(loc) or "body"
        param = param or field
        value = error.get("input")
        shown = f" (got {_short(value)})" if loc and not isinstance(value, dict | list) else ""
        top = field.split(".")[0]
        if top not in problems:  # one message per field: a union's branches would repeat it
            message = str(error.get("msg", "")).removeprefix("Value error, ")
            problems[top] = f"{field}: {message}{shown}"
    return APIError(400, "invalid request: " + "; ".join(problems.values()), param=param, code="invalid_value")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return error_response(describe_validation(exc))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        kinds = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
        return error_response(APIError(exc.status_code, str(exc.detail), "invalid_request_error",
                                       code=kinds.get(exc.status_code)))

    @app.exception_handler(APIError)
    @app.exception_handler(HeteroError)
    async def _ours(request: Request, exc: Exception):
        return error_response(to_api_error(exc))
