"""The errors an ``AsyncLLM`` stream raises besides ``InvalidRequestError`` (all are ``HeteroError``)."""

from __future__ import annotations

from hetero_core.errors import HeteroError

__all__ = ["EngineDeadError", "EngineOverloadedError", "EngineStepError", "RequestFailedError"]


class RequestFailedError(HeteroError):
    """The engine reported the request failed (e.g. it can never fit ``max_model_len``)."""


class EngineStepError(RequestFailedError):
    """An engine step raised while this request was in it."""


class EngineDeadError(HeteroError):
    """The engine loop has stopped (shut down, or the engine became inconsistent)."""


class EngineOverloadedError(HeteroError):
    """More requests are pending than ``max_pending_requests`` allows."""
