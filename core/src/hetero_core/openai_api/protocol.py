"""Request and response bodies of the OpenAI API, as pydantic models (the fields Hetero serves).

Requests ignore fields they do not know (clients send many); fields they know are validated here,
so a wrong type or range becomes a 400 that names the field. Types are strict, as OpenAI's and
vLLM's: ``"5"`` is not an integer and ``"yes"`` is not a boolean (a number field takes an integer, as
JSON has one number type). Values that depend on the model (prompt length against ``max_model_len``)
are checked by the engine; the number of choices against the server's limit by the routes.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from hetero_core.engine.requests.params import MAX_LOGPROBS, MAX_REPETITION_PENALTY, MIN_REPETITION_PENALTY
from hetero_core.engine.requests.sequence import MAX_TENANT_LENGTH
from hetero_core.openai_api.extras import SamplingExtras
from hetero_core.openai_api.request_model import RequestModel
from hetero_core.openai_api.tool_protocol import (
    NamedToolChoice,
    Tool,
    ToolCall,
    ToolCallDelta,
    ToolCallOut,
)

MAX_N = 16
MAX_STOP_STRINGS = 16

# The shapes the schema documents; the "before" validators below check the same with clearer messages.
Text = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
Prompt = (
    Text
    | Annotated[list[Text], Field(min_length=1)]
    | TokenIds
    | Annotated[list[TokenIds], Field(min_length=1)]
)
Stop = Text | Annotated[list[Text], Field(max_length=MAX_STOP_STRINGS)]


class StreamOptions(RequestModel):
    include_usage: bool = False


class JsonSchemaFormat(RequestModel):
    name: str = Field("response", min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None  # the schema is always enforced


class ResponseFormat(RequestModel):
    """OpenAI's ``response_format``: ``text`` (free), ``json_object`` (any JSON object) or ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class GuidedFields(RequestModel):
    """Structured output: OpenAI's ``response_format`` and vLLM's ``guided_*`` extras (at most one)."""

    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = Field(None, min_length=1)
    guided_choice: list[Annotated[str, Field(min_length=1)]] | None = Field(None, min_length=1)
    guided_grammar: str | None = Field(None, min_length=1)


class SamplingFields(GuidedFields, SamplingExtras):
    """Fields completions and chat share; ``None`` means the server's default."""

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    stop: Stop | None = None
    seed: int | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY)
    ignore_eos: bool = False
    priority: int | None = None  # vLLM's extra field: lower is served first
    user: str | None = Field(None, min_length=1, max_length=MAX_TENANT_LENGTH)  # the tenant

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings(cls, value):
        if not (
            value is None
            or isinstance(value, str)
            or (isinstance(value, list) and all(isinstance(s, str) for s in value))
        ):
            raise ValueError("expected a string or a list of strings")
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops or None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: Prompt
    max_tokens: int | None = Field(16, ge=0)  # 0: only with echo (the prompt's logprobs, no token)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False  # the prompt back before the answer (openai_api/echo.py)
    suffix: None = None
    best_of: int | None = Field(None, ge=1, le=MAX_N)

    @field_validator("suffix", mode="before")
    @classmethod
    def _unsupported(cls, value, info):
        if value:
            raise ValueError(f"{info.field_name} is not supported by this server; leave it out")
        return value

    @model_validator(mode="after")
    def _no_tokens_needs_echo(self):
        if self.max_tokens == 0 and not self.echo:
            raise ValueError(
                "max_tokens 0 generates nothing: it needs echo true (the prompt back, with its "
                "logprobs if logprobs is set); or set max_tokens to 1 or more"
            )
        return self

    @property
    def generates(self) -> bool:
        """Whether the answer keeps generated tokens (``max_tokens`` 0 with echo keeps none)."""
        return self.max_tokens != 0

    @property
    def engine_max_tokens(self) -> int | None:
        """``max_tokens`` for the engine, which runs at least one token (dropped when ``max_tokens`` is 0)."""
        return 1 if self.max_tokens == 0 else self.max_tokens

    @property
    def echo_logprobs(self) -> bool:
        """Whether the answer lists the prompt's tokens and logprobs (``echo`` with ``logprobs``)."""
        return self.echo and self.logprobs is not None

    def sampling_extras(self) -> dict:
        """With echo and logprobs, the engine computes the prompt's logprobs (the top ``logprobs``, or
        more when ``prompt_logprobs`` asks more)."""
        extras = super().sampling_extras()
        if self.echo_logprobs:
            extras["prompt_logprobs"] = max(self.logprobs, self.prompt_logprobs or 0)
        return extras

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value):
        def is_ids(v):
            return isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)

        if not (
            isinstance(value, str)
            or is_ids(value)
            or (isinstance(value, list) and all(isinstance(p, str) or is_ids(p) for p in value))
        ):
            raise ValueError(
                "expected a string, a list of strings, a list of token ids or a list of token-id lists"
            )
        if not value:
            raise ValueError("the prompt is empty")
        if isinstance(value, list) and any(not p for p in value):
            raise ValueError("the prompt list holds an empty prompt")
        return value

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: a string or a list of token ids."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if all(isinstance(p, int) for p in self.prompt):
            return [list(self.prompt)]
        return list(self.prompt)


MEDIA_PARTS = ("image_url", "input_image", "image", "input_audio", "audio", "file", "input_file", "video_url")


class TextPart(RequestModel):
    type: Literal["text"]
    text: str


class ChatMessage(RequestModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's answer: which call it answers
    name: str | None = None

    @property
    def text(self) -> str:
        content = self.content
        return "".join(part.text for part in content) if isinstance(content, list) else content or ""

    def as_dict(self) -> dict[str, str]:
        """The message as the chat template takes it (``name`` too, for templates that show it)."""
        message = {"role": "system" if self.role == "developer" else self.role, "content": self.text}
        return message if self.name is None else {**message, "name": self.name}


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    add_generation_prompt: bool = True  # vLLM's chat-template extras (openai_api/chat_prompt.py)
    chat_template_kwargs: dict[str, Any] | None = None

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @field_validator("messages", mode="before")
    @classmethod
    def _text_only(cls, value):
        """An image, audio or file part is refused by name (the served models take text only)."""
        for i, message in enumerate(value if isinstance(value, list) else ()):
            content = message.get("content") if isinstance(message, dict) else None
            for j, part in enumerate(content if isinstance(content, list) else ()):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind in MEDIA_PARTS:
                    article = "an" if kind[0] in "aeiou" else "a"
                    raise ValueError(
                        f"messages[{i}].content[{j}] is {article} {kind} part; this model takes "
                        'text only: send text parts (type "text") or a string'
                    )
        return value


# -- responses ------------------------------------------------------------------------------------
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """vLLM's ``Logprob`` of a prompt token or an alternative (``prompt_logprobs`` extra)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    # vLLM's extra: None for the first prompt token, then {token id: PromptLogprob} per prompt token
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float | None
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] = Field(default_factory=list)


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    # vLLM's extra (``prompt_logprobs``): the prompt's, as CompletionChoice has them
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "hetero"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every error the server answers: OpenAI's ``{"error": {...}}``."""

    error: ErrorInfo


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    reason: str | None = None
