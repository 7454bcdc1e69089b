"""POST /tokenize and /detokenize (vLLM's extra endpoints): the served model's tokenizer, off the
event loop."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from hetero_core.engine.requests.prompts import tokenize_prompt
from hetero_core.errors import InvalidRequestError
from hetero_core.openai_api.token_protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from hetero_core.server.body import parse_body
from hetero_core.server.openapi import errors
from hetero_core.server.state import get_state

router = APIRouter()


def json_route(request_model) -> dict:
    """``router.post`` arguments: the body is ``request_model`` (in the schema's components), errors
    as documented."""
    return {
        "responses": errors(400, 401, 404, 413),
        "openapi_extra": {
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{request_model.__name__}"}}
                },
            }
        },
    }


@router.post("/tokenize", **json_route(TokenizeRequest))
async def tokenize(request: Request) -> TokenizeResponse:
    """The prompt's token ids (or the chat messages', with the generation prompt), as the engine would
    see them."""
    body = await parse_body(request, TokenizeRequest)
    state = get_state(request)
    state.check_model(body.model)
    prompt = body.prompt if body.prompt is not None else [m.as_dict() for m in body.messages]
    tokens = await asyncio.to_thread(tokenize_prompt, _tokenizer(state, "/tokenize"), prompt)
    return TokenizeResponse(count=len(tokens), max_model_len=state.max_model_len, tokens=tokens)


@router.post("/detokenize", **json_route(DetokenizeRequest))
async def detokenize(request: Request) -> DetokenizeResponse:
    """The text of token ids (each must lie in the vocabulary)."""
    body = await parse_body(request, DetokenizeRequest)
    state = get_state(request)
    state.check_model(body.model)
    tokenizer = _tokenizer(state, "/detokenize")
    ids = tokenize_prompt(tokenizer, body.tokens)  # checks every id against the vocabulary
    return DetokenizeResponse(prompt=await asyncio.to_thread(tokenizer.decode, ids))


def _tokenizer(state, path: str):
    """The engine's tokenizer; a server whose frontend holds none (replicas) refuses by name."""
    tokenizer = getattr(state.llm.engine, "tokenizer", None)
    if tokenizer is None:
        raise InvalidRequestError(f"{path} is not available here: the replicas' frontend holds no tokenizer")
    return tokenizer
