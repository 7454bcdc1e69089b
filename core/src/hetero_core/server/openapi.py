"""What ``/openapi.json`` says: each route's request body (the strict models of ``protocol.py``), its
answers and every status it can give, errors as OpenAI's error JSON. The schema is the contract the
fuzz tests hold the server to (tests/server/test_server_fuzz.py).

The routes parse their bodies themselves (``body.py``), so FastAPI never sees the request models;
``install_openapi`` adds them to the schema's components, and the API key as a bearer scheme.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from hetero_core.openai_api.protocol import ErrorResponse

ERROR_STATUSES = {
    400: "invalid request: the message names the field",
    401: "missing or wrong API key (when the server has one)",
    404: "unknown model",
    413: "body over max_body_bytes",
    429: "more than max_pending_requests at once",
    500: "an engine step failed",
    503: "the engine has stopped",
}


def errors(*statuses: int) -> dict:
    return {s: {"model": ErrorResponse, "description": ERROR_STATUSES[s]} for s in statuses}


def generation_route(request: type[BaseModel], response: type[BaseModel], chunk: type[BaseModel]) -> dict:
    """``router.post`` arguments of an endpoint that generates: JSON body in, JSON or events out. Each
    event of a stream is described as OpenAPI 3.2 does (its ``data`` holds JSON of the given schema)."""

    def json_data(model: type[BaseModel]) -> dict:
        return {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {"$ref": f"#/components/schemas/{model.__name__}"},
        }

    events = {
        "schema": {
            "description": f"one server-sent event: data: <{chunk.__name__}> for each new piece of text, "
            "data: <ErrorResponse> if the engine fails after the stream started, then data: [DONE]",
            "type": "object",
            "required": ["data"],
            "properties": {
                "data": {"anyOf": [json_data(chunk), json_data(ErrorResponse), {"const": "[DONE]"}]}
            },
        }
    }
    return {
        "response_model": None,
        "responses": {
            200: {
                "model": response,
                "content": {"text/event-stream": events},
                "description": "the answer; with stream: true, server-sent events",
            },
            **errors(400, 401, 404, 413, 429, 500, 503),
        },
        "openapi_extra": {
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{request.__name__}"}}
                },
            }
        },
    }


def install_openapi(
    app: FastAPI, models: list[type[BaseModel]], *, public_paths: frozenset[str], has_api_key: bool
) -> None:
    """Serve a schema that holds ``models`` (and, with a key, bearer auth on non-public paths)."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            _, definitions = models_json_schema(
                [(m, "validation") for m in models], ref_template="#/components/schemas/{model}"
            )
            components = schema.setdefault("components", {})
            components.setdefault("schemas", {}).update(definitions.get("$defs", {}))
            if has_api_key:
                components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
                for path, operations in schema["paths"].items():
                    for operation in operations.values():
                        if path not in public_paths:
                            operation["security"] = [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
