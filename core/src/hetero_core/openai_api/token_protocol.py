"""Bodies of vLLM's extra endpoints: ``/tokenize``, ``/detokenize`` and ``/version``."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, model_validator

from hetero_core.openai_api.protocol import ChatMessage, RequestModel


class TokenizeRequest(RequestModel):
    """Exactly one of ``prompt`` (plain text) or ``messages`` (through the chat template)."""

    model: str | None = None
    prompt: str | None = Field(None, min_length=1)
    messages: list[ChatMessage] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(RequestModel):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str
