"""The request body of OpenAI's Responses API (``POST /v1/responses``), as pydantic models: the fields
Hetero serves. ``responses_convert.py`` turns it into a chat request; unknown fields are ignored (clients
send ``reasoning``, ``include``, ``truncation``, ...), known ones are validated, a wrong one is a 400 that
names it.

The input is a string (one user message) or a list of items: messages (``type`` may be left out, as the
openai client's easy messages do), an assistant's earlier ``function_call`` and the caller's
``function_call_output`` answering it. Reasoning items an agent sends back are dropped (this server
writes none). Only function tools are served; text parts only (an image, file or audio part is refused
by name).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator

from hetero_core.engine.requests.params import MAX_LOGPROBS
from hetero_core.engine.requests.sequence import MAX_TENANT_LENGTH
from hetero_core.openai_api.extras import SamplingExtras
from hetero_core.openai_api.request_model import RequestModel

NOT_TEXT = ("input_image", "input_file", "input_audio", "image_url")


class ContentPart(RequestModel):
    type: Literal["input_text", "output_text", "text", "refusal"]
    text: str = ""
    refusal: str | None = None

    @field_validator("type", mode="before")
    @classmethod
    def _text_only(cls, value):
        if value in NOT_TEXT:
            raise ValueError(
                f"this model takes text only: a {value} part cannot be read; send input_text parts"
            )
        return value


class MessageItem(RequestModel):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: list[ContentPart] | str  # a string is one text part (the validator makes it one)

    @field_validator("content", mode="before")
    @classmethod
    def _string_content(cls, value):
        return [{"type": "input_text", "text": value}] if isinstance(value, str) else value

    @property
    def text(self) -> str:
        return "".join(part.text or part.refusal or "" for part in self.content)


class FunctionCallItem(RequestModel):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str = "{}"
    id: str | None = None


class FunctionCallOutputItem(RequestModel):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[ContentPart]

    @property
    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


class ReasoningItem(RequestModel):
    type: Literal["reasoning"]


def _item_type(value) -> str | None:
    """An item's ``type``; a message may leave it out."""
    if isinstance(value, dict):
        return value.get("type", "message")
    return getattr(value, "type", None)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]


class FunctionTool(RequestModel):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("type", mode="before")
    @classmethod
    def _functions_only(cls, value):
        if value != "function":
            raise ValueError(
                f'only function tools are served, not {value!r}; give {{"type": "function", '
                '"name": ..., "parameters": ...}'
            )
        return value


class NamedFunctionChoice(RequestModel):
    type: Literal["function"]
    name: str = Field(min_length=1)


class TextFormat(RequestModel):
    """``text.format``: ``text`` (free), ``json_object`` or ``json_schema`` (its fields flat, as the
    Responses API has them)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str = Field("response", min_length=1, max_length=64)
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None  # the schema is always enforced


class TextConfig(RequestModel):
    format: TextFormat | None = None


class ResponsesRequest(SamplingExtras):
    model: str | None = None
    # A string is one user message (the validator makes it one); the list first: its errors are named.
    input: Annotated[list[InputItem], Field(min_length=1)] | Annotated[str, Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)  # vLLM's extras, as on chat
    seed: int | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    stream: bool = False
    store: bool = True  # kept in the server's bounded store (responses_store.py) for previous_response_id
    previous_response_id: str | None = Field(None, min_length=1)
    metadata: dict[str, str] | None = None  # given back in the answer
    user: str | None = Field(None, min_length=1, max_length=MAX_TENANT_LENGTH)  # the tenant

    @field_validator("input", mode="before")
    @classmethod
    def _string_input(cls, value):
        if isinstance(value, str):
            if not value:
                raise ValueError("the input is empty")
            return [{"type": "message", "role": "user", "content": value}]
        return value
