"""The responses a server keeps for ``previous_response_id`` and ``GET /v1/responses/{id}``: the newest
``MAX_STORED_RESPONSES`` with ``store`` true (the default, as OpenAI's), in memory, the oldest dropped first.
Each keeps its answer and its conversation (the chat turns a follow-up continues from)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from fastapi import Request

from hetero_core.openai_api.responses_output import Response
from hetero_core.server.errors import APIError

MAX_STORED_RESPONSES = 256


@dataclass(frozen=True)
class Stored:
    response: Response
    conversation: list[dict]  # chat messages, instructions left out (they are not carried over)


class ResponseStore:
    def __init__(self, capacity: int = MAX_STORED_RESPONSES) -> None:
        self.capacity = capacity
        self._kept: OrderedDict[str, Stored] = OrderedDict()

    def put(self, response: Response, conversation: list[dict]) -> None:
        self._kept[response.id] = Stored(response, conversation)
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)

    def get(self, response_id: str, param: str = "response_id") -> Stored:
        stored = self._kept.get(response_id)
        if stored is None:
            raise APIError(
                404,
                f"no stored response {response_id!r}: this server keeps the last "
                f"{self.capacity} responses made with store true",
                param=param,
                code="response_not_found",
            )
        return stored


def response_store(request: Request) -> ResponseStore:
    """The app's store, made on first use."""
    state = request.app.state
    if not hasattr(state, "responses"):
        state.responses = ResponseStore()
    return state.responses
