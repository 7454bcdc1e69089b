"""Tool calling's bodies (OpenAI's shapes): the functions a request offers, the choice it makes, the
calls in a request's earlier messages, in an answer and in a stream's deltas."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from hetero_core.openai_api.request_model import RequestModel


class FunctionCall(RequestModel):
    name: str = Field(min_length=1)
    arguments: str = "{}"  # JSON text, as OpenAI sends it


class ToolCall(RequestModel):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(RequestModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(RequestModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(RequestModel):
    name: str = Field(min_length=1)


class NamedToolChoice(RequestModel):
    type: Literal["function"]
    function: NamedFunction


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class FunctionCallDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta
