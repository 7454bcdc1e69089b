"""The one place a request body is read and parsed.

The body is parsed by pydantic's own JSON parser straight into the request model, never by
``json.loads``: nesting is bounded (200 levels), integers of more than 4300 digits are a parse error
instead of a ``ValueError``, text must be valid Unicode (a lone surrogate escape such as ``"\\ud800"``
is refused here, so no handler or tokenizer ever sees one), and the models are strict (``"5"`` is
not an integer, ``"yes"`` is not a boolean). Every failure is a 400 that names the field.
"""

from __future__ import annotations

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from hetero_core.server.errors import APIError, ClientDisconnected, describe_validation


async def parse_body(request: Request, model: type[BaseModel]):
    """The JSON body as ``model`` (whatever the Content-Type says); 400 naming the field if not."""
    try:
        raw = await request.body()
    except ClientDisconnect:  # the client left mid-upload: nobody to answer
        raise ClientDisconnected("upload") from None
    if not raw.strip():
        raise APIError(400, "the request body is empty: send a JSON object", code="invalid_json")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise describe_validation(exc.errors()) from None
