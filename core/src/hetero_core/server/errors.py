"""One place that turns errors into OpenAI's error JSON: {"error": {message, type, param, code}}."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
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


class ClientDisconnected(Exception):
    """The client went away before its answer was ready (while uploading, or while it ran)."""

    def __init__(self, during: str = "generation") -> None:
        super().__init__(f"client disconnected during {during}")
        self.during = during


class APIError(Exception):
    """An error answered with ``status`` and OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(error: APIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    return JSONResponse(
        error_body(error.message, error.type, error.param, error.code), error.status, headers=headers
    )


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


def describe_validation(errors: list[dict]) -> APIError:
    """A 400 naming the first bad field (``messages.0.role: ...``) and listing the others; ``errors``
    are pydantic's (``ValidationError.errors()``)."""
    problems: dict[str, str] = {}
    param = None
    for error in errors:
        loc = [str(p) for p in error.get("loc", ()) if p != "body"]
        if error.get("type") == "json_invalid":
            return APIError(
                400,
                "the request body is not valid JSON: " + _json_problem(str(error.get("msg"))),
                code="invalid_json",
            )
        if error.get("type") == "model_type" and not loc:  # the body itself is not an object
            got = _JSON_TYPES.get(type(error.get("input")), "a scalar")
            return APIError(400, f"the request body must be a JSON object, got {got}", code="invalid_json")
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
    return APIError(
        400, "invalid request: " + "; ".join(problems.values()), param=param, code="invalid_value"
    )


_JSON_TYPES = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}
# What the JSON parser's terse messages mean for the client, and the fix.
_JSON_HINTS = {
    "surrogate": (
        "text must be valid Unicode: a \\uD800-\\uDFFF escape is only valid as half of a surrogate pair"
    ),
    "hex escape": (
        "text must be valid Unicode: a \\uD800-\\uDFFF escape is only valid as half of a surrogate pair"
    ),
    "recursion limit": "arrays and objects may nest at most 200 deep",
    "number out of range": "integers may have at most 4300 digits",
}


def _json_problem(message: str) -> str:
    message = message.removeprefix("Invalid JSON: ")
    hint = next((h for key, h in _JSON_HINTS.items() if key in message), None)
    return f"{message} ({hint})" if hint else message


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def install_error_handlers(app: FastAPI) -> None:
    """OpenAI error JSON for every error: ours, FastAPI's and Starlette's by handler, anything else
    (a bug) by ``InternalErrorGuard`` around the whole app."""

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return error_response(describe_validation(exc.errors()))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        kinds = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
        return error_response(
            APIError(
                exc.status_code, str(exc.detail), "invalid_request_error", code=kinds.get(exc.status_code)
            )
        )

    @app.exception_handler(APIError)
    @app.exception_handler(HeteroError)
    async def _ours(request: Request, exc: Exception):
        return error_response(to_api_error(exc))

    @app.exception_handler(ClientDisconnected)
    async def _gone(request: Request, exc: ClientDisconnected):
        log.info("request.client_disconnected", path=request.url.path, during=exc.during)
        return Response(status_code=499)  # nobody reads this; nginx's "client closed request"

    app.add_middleware(InternalErrorGuard)


class InternalErrorGuard:
    """Outermost ASGI guard: an exception no handler took (a bug) is logged once with its traceback
    and answered with a 500 in OpenAI's error JSON. Starlette's own fallback answers in plain text and
    re-raises, so uvicorn drops the connection and the client's next request on it is reset."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def send_tracked(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception as exc:
            log.error("server.internal_error", path=scope.get("path"), error=repr(exc), exc_info=exc)
            if not started:  # else the response is cut short; uvicorn closes the connection
                await error_response(
                    APIError(500, f"internal server error: {type(exc).__name__}", "server_error")
                )(scope, receive, send)
