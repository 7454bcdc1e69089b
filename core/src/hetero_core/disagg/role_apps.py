"""The HTTP apps of the two roles (``hetero serve --role prefill|decode``), for the front end alone.

``POST /disagg/prefill`` (prefill role): a prompt and its sampling parameters; the engine runs the prompt
with ``max_tokens = 1`` and ``export_kv``, the KV connector publishes the prompt's blocks, and the
answer is the first token, the prompt's token ids and where to fetch the blocks.

``POST /disagg/decode`` (decode role): that answer plus the request; the connector fetches the blocks
(``kv_transfer_timeout_s``), the engine continues the request from them (``kv_transfer``) and the
response streams one frame per ``RequestDelta`` (``wire``). A failed fetch fails this request alone.

Both answer ``GET /health`` and ``GET /disagg/info`` (the engine's length limit and default params).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from time import perf_counter

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from hetero_core.async_llm import AsyncLLM
from hetero_core.disagg.wire import CONTENT_TYPE, RemoteError, frame, loads
from hetero_core.engine.kv.kv_transfer import KVHandoff, KVTransferError
from hetero_core.logging import get_logger

log = get_logger("hetero.disagg")
ROLES = ("prefill", "decode")


def create_role_app(role: str, llm: AsyncLLM, connector, *, kv_transfer_timeout_s: float = 30.0) -> FastAPI:
    """The app of ``role`` (prefill or decode) over ``llm`` and a KV connector."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    app = FastAPI(title=f"Hetero {role}", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/health")
    async def health():
        if llm.is_running:
            return JSONResponse({"status": "ok", "role": role})
        return JSONResponse(
            {"status": "unavailable", "role": role, "reason": llm.dead_reason or "shut down"}, 503
        )

    @app.get("/disagg/info")
    async def info():
        engine = llm.engine
        return Response(
            frame(
                {"max_model_len": engine.max_model_len, "default_params": engine.default_params, "role": role}
            ),
            media_type=CONTENT_TYPE,
        )

    if role == "prefill":

        @app.post("/disagg/prefill")
        async def prefill(request: Request):
            return Response(
                frame(await _prefill(llm, connector, loads(await request.body()))), media_type=CONTENT_TYPE
            )
    else:

        @app.post("/disagg/decode")
        async def decode(request: Request):
            body = loads(await request.body())
            return StreamingResponse(
                _decode(llm, connector, body, kv_transfer_timeout_s), media_type=CONTENT_TYPE
            )

    return app


async def _prefill(llm: AsyncLLM, connector, body: dict) -> dict:
    params = body["params"]
    one_token = replace(params, max_tokens=1, min_tokens=min(params.min_tokens, 1))
    started, final = perf_counter(), None
    try:
        async for delta in llm.generate(
            body["prompt"],
            one_token,
            body["request_id"],
            priority=body.get("priority"),
            tenant=body.get("tenant"),
            export_kv=True,
        ):
            final = delta.output
        address = connector.publish(body["request_id"], final.kv_blocks)
    except Exception as exc:  # travels to the front end, raised there as the engine's error
        return {"error": RemoteError.of(exc)}
    return {
        "first_token_id": final.output_token_ids[0],
        "first_logprobs": final.logprobs[0] if final.logprobs else None,
        "prompt_token_ids": final.prompt_token_ids,
        "address": address,
        "transfer_id": body["request_id"],
        "num_cached_tokens": final.num_cached_tokens,
        "prefill_s": perf_counter() - started,
    }


async def _decode(llm: AsyncLLM, connector, body: dict, timeout: float):
    handoff = body["handoff"]
    started = perf_counter()
    try:
        blocks = await asyncio.to_thread(connector.fetch, handoff["address"], handoff["transfer_id"], timeout)
    except KVTransferError as exc:
        log.warning("disagg.kv_fetch_failed", request_id=body["request_id"], error=str(exc))
        yield frame(
            RemoteError(
                "KVTransferError", f"fetching the prompt's KV blocks from the prefill engine failed: {exc}"
            )
        )
        return
    timings = {"prefill_s": handoff["prefill_s"], "transfer_s": perf_counter() - started}
    yield frame(timings)
    kv = KVHandoff(handoff["first_token_id"], blocks, handoff["first_logprobs"], timings)
    try:
        async for delta in llm.generate(
            handoff["prompt_token_ids"],
            body["params"],
            body["request_id"],
            fit_max_tokens=body.get("fit_max_tokens", False),
            priority=body.get("priority"),
            tenant=body.get("tenant"),
            kv_transfer=kv,
        ):
            yield frame(delta)
    except Exception as exc:
        yield frame(RemoteError.of(exc))
