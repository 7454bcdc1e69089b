"""AsyncLLM: one engine served to many asyncio callers (``async_llm``), stepped by one loop thread
(``engine_loop``), each request's deltas streamed back (``request_stream``); its errors (``errors``)."""

from hetero_core.async_llm.async_llm import DEFAULT_MAX_PENDING_REQUESTS, AsyncLLM
from hetero_core.async_llm.engine_loop import EngineStats
from hetero_core.async_llm.errors import (
    EngineDeadError,
    EngineOverloadedError,
    EngineStepError,
    RequestFailedError,
)
from hetero_core.async_llm.request_stream import RequestDelta, TokenLogprob

__all__ = [
    "DEFAULT_MAX_PENDING_REQUESTS",
    "AsyncLLM",
    "EngineDeadError",
    "EngineOverloadedError",
    "EngineStats",
    "EngineStepError",
    "RequestDelta",
    "RequestFailedError",
    "TokenLogprob",
]
