"""Batch files: one request per JSON line, read and checked before anything runs.

Two formats, detected from the file's first valid line:
- Hetero's own: ``{"id": .., "prompt": "text" or [token ids], ...}`` or ``{"messages": [...]}``, with
  optional sampling fields (any ``SamplingParams`` field; ``logprobs`` also as a chat body has it,
  ``true`` with ``top_logprobs``), ``priority`` and ``tenant``; ``id`` defaults to the line number.
- OpenAI's Batch API (as vLLM's ``run-batch`` reads it): ``{"custom_id", "method": "POST", "url":
  "/v1/completions" | "/v1/chat/completions", "body": {...}}``; the body is validated by the
  server's own request models and converted as the server converts it (sampling fields and extras,
  ``response_format`` / ``guided_*``, ``tools`` / ``tool_choice``); a prompt's ``n`` (or ``best_of``)
  completions are one engine request, ``SamplingParams(n=...)``, sharing the prompt's KV blocks.

Every line is read by one bounded decoder (``batch_json.decode_line``). A malformed line becomes a
``Malformed`` entry (line number, reason, and its id when it has a valid one): it is never run; it
gets an error row, and ``--resume`` reads it again, so fixing it and resuming runs just that line.
Two lines with the same id are an error for the whole file (results are matched by id).
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from hetero_core.batch_files.json_lines import decode_line
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.errors import HeteroError, InvalidRequestError

NATIVE, OPENAI = "native", "openai"
OPENAI_URLS = ("/v1/completions", "/v1/chat/completions")
NATIVE_KEYS = ("id", "prompt", "messages", "priority", "tenant")


@dataclass(frozen=True)
class BatchRequest:
    """One valid line: its choices (prompt, params) run as engine requests."""

    line_number: int
    id: Any  # the id results are written under: native ``id`` or OpenAI ``custom_id``
    choices: list[tuple[Any, SamplingParams]]  # one per prompt; its params' n completions share it
    priority: int = 0
    tenant: str | None = None
    url: str | None = None  # OpenAI format: the endpoint the body was meant for
    body: Any = None  # OpenAI format: the validated request model

    @property
    def key(self) -> str:
        return id_key(self.id)


@dataclass(frozen=True)
class Malformed:
    line_number: int
    reason: str
    id: Any = None  # the line's id (native: its default, the line number, too) when it has a valid one


@dataclass
class BatchFile:
    format: str
    requests: list[BatchRequest] = field(default_factory=list)
    malformed: list[Malformed] = field(default_factory=list)


def id_key(value: Any) -> str:
    """A hashable key for an id as JSON has it (1 and "1" differ)."""
    return json.dumps(value, sort_keys=True)


def read_batch_file(
    lines: Iterable[bytes | str],
    defaults: SamplingParams,
    *,
    chat: bool,
    max_model_len: int,
    count_tokens=None,
    tokenizer=None,
) -> BatchFile:
    """Parse every line. ``chat``: send a native string prompt through the chat template.
    ``count_tokens(prompt)``: the prompt's length, to fit an OpenAI chat body's default max_tokens.
    ``tokenizer``: renders an OpenAI chat body with vLLM's chat-template extras (``chat_prompt``)."""
    batch = BatchFile(format="")
    seen: dict[str, int] = {}
    for number, text in enumerate(lines, start=1):
        line_id = None
        try:
            value = decode_line(text)
            if value is None:
                continue
            if not isinstance(value, dict):
                raise InvalidRequestError(f"a line must be a JSON object, got {type(value).__name__}")
            batch.format = batch.format or (OPENAI if "custom_id" in value or "body" in value else NATIVE)
            line_id = _line_id(batch.format, value, number)
            if batch.format == OPENAI:
                request = _openai_request(number, value, defaults, max_model_len, count_tokens, tokenizer)
            else:
                request = _native_request(number, value, defaults, chat)
        except (InvalidRequestError, ValueError, TypeError, ArithmeticError) as exc:
            # the last three: a value the checks let through (an int too large for a float) fails its
            # line, never the file
            reason = str(exc) if isinstance(exc, InvalidRequestError) else f"invalid value: {exc}"
            batch.malformed.append(Malformed(number, reason, line_id))
            _check_unique(seen, line_id, number)
            continue
        _check_unique(seen, request.id, number)
        batch.requests.append(request)
    batch.format = batch.format or NATIVE
    return batch


def show(value: Any) -> str:
    """``repr(value)``, shortened for a message (an id or a field can be megabytes long)."""
    return _SHORT.repr(value)


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80


def _check_unique(seen: dict[str, int], line_id: Any, number: int) -> None:
    if line_id is None:
        return
    key = id_key(line_id)
    if key in seen:
        raise HeteroError(
            f"duplicate id {show(line_id)} on lines {seen[key]} and {number}; "
            "every line needs its own id (results are matched by id)"
        )
    seen[key] = number


def _line_id(batch_format: str, value: dict, number: int) -> Any:
    """The id a line's results go under, or None when it has no valid one."""
    if batch_format == OPENAI:
        custom_id = value.get("custom_id")
        return custom_id if isinstance(custom_id, str) and custom_id else None
    request_id = value.get("id", number)
    return request_id if _is_valid_id(request_id) else None


def _is_valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _native_request(number: int, value: dict, defaults: SamplingParams, chat: bool) -> BatchRequest:
    if "custom_id" in value or "body" in value:
        raise InvalidRequestError(
            "an OpenAI batch line in a file of Hetero lines (the first valid line "
            "decides the format; use one format per file)"
        )
    has_prompt, has_messages = "prompt" in value, "messages" in value
    if has_prompt == has_messages:
        raise InvalidRequestError(
            "a line needs exactly one of 'prompt' (text or token ids) or 'messages' (chat)"
        )
    prompt = value["prompt"] if has_prompt else value["messages"]
    if has_prompt and not isinstance(prompt, (str, list)):
        raise InvalidRequestError(
            f"'prompt' must be a string or a list of token ids, got {type(prompt).__name__}"
        )
    if has_messages and not isinstance(prompt, list):
        raise InvalidRequestError(
            f"'messages' must be a list of {{'role', 'content'}} objects, got {type(prompt).__name__}"
        )
    if chat and isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    sampling = _chat_style_logprobs({k: v for k, v in value.items() if k not in NATIVE_KEYS})
    SamplingParams.from_dict(sampling)  # names unknown fields against this line's own
    params = SamplingParams.from_dict({**asdict(defaults), **sampling})
    if params.num_samples > 1:
        raise InvalidRequestError(
            "'n' / 'best_of' above 1: a Hetero batch line has one answer; use OpenAI-format "
            "lines ('n' in the body) for several"
        )
    request_id = value.get("id", number)
    if not _is_valid_id(request_id):
        raise InvalidRequestError(f"'id' must be a string or an integer, got {type(request_id).__name__}")
    priority, tenant = value.get("priority", 0), value.get("tenant")
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise InvalidRequestError(f"'priority' must be an integer, got {type(priority).__name__}")
    if tenant is not None and not isinstance(tenant, str):
        raise InvalidRequestError(f"'tenant' must be a string, got {type(tenant).__name__}")
    return BatchRequest(number, request_id, [(prompt, params)], priority, tenant)


def _chat_style_logprobs(sampling: dict) -> dict:
    """``"logprobs": true`` with an optional ``"top_logprobs": N`` (as a chat body has them) means
    ``"logprobs": N``, the number of alternatives per token (0: only the chosen token's logprob)."""
    if "top_logprobs" not in sampling and not isinstance(sampling.get("logprobs"), bool):
        return sampling
    sampling = dict(sampling)
    top, wanted = sampling.pop("top_logprobs", None), sampling.pop("logprobs", None)
    if isinstance(wanted, int) and not isinstance(wanted, bool):
        raise InvalidRequestError(
            "give 'logprobs': N (alternatives per token), or 'logprobs': true with "
            "'top_logprobs': N, not both"
        )
    if top is not None and not (isinstance(top, int) and not isinstance(top, bool)):
        raise InvalidRequestError(f"'top_logprobs' must be an integer, got {type(top).__name__}")
    if wanted is True:
        sampling["logprobs"] = top or 0
    elif top is not None:
        raise InvalidRequestError("'top_logprobs' needs 'logprobs': true")
    return sampling


def _openai_request(
    number: int, value: dict, defaults: SamplingParams, max_model_len: int, count_tokens, tokenizer
) -> BatchRequest:
    from pydantic import ValidationError

    from hetero_core.openai_api.chat_prompt import chat_prompt
    from hetero_core.openai_api.convert import sampling_params
    from hetero_core.openai_api.protocol import ChatCompletionRequest, CompletionRequest
    from hetero_core.openai_api.tools import tool_mode, with_tool_grammar

    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise InvalidRequestError("an OpenAI batch line needs a non-empty string 'custom_id'")
    method, url = value.get("method", "POST"), value.get("url")
    if method != "POST":
        raise InvalidRequestError(f"'method' must be \"POST\", got {show(method)}")
    if url not in OPENAI_URLS:
        raise InvalidRequestError(f"unsupported 'url' {show(url)}; supported: {', '.join(OPENAI_URLS)}")
    model = CompletionRequest if url == "/v1/completions" else ChatCompletionRequest
    try:
        body = model.model_validate(value.get("body"))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise InvalidRequestError(f"invalid body for {url}: {problems}") from None
    if body.stream:
        raise InvalidRequestError("'stream' must be false in a batch file (each answer is written whole)")
    best_of = None
    if model is CompletionRequest:
        best_of = body.best_of
        if best_of is not None and best_of < body.n:
            raise InvalidRequestError(f"best_of ({best_of}) must be at least n ({body.n})")
        prompts, max_tokens, num_logprobs = body.prompts, body.engine_max_tokens, body.logprobs
    else:  # tools as the server offers them: in the prompt, and required / named enforced by a grammar
        mode = tool_mode(body)
        prompts, max_tokens = (
            [chat_prompt(body, mode, tokenizer)],
            body.max_completion_tokens or body.max_tokens,
        )
        body, num_logprobs = with_tool_grammar(body, mode), body.num_logprobs
    # n completions of a prompt are one engine request (SamplingParams.n): they share its KV blocks
    base = replace(sampling_params(body, defaults, max_tokens, num_logprobs), n=body.n, best_of=best_of)
    choices = []
    for prompt in prompts:
        params = base
        if max_tokens is None and count_tokens is not None:  # as the server: fit what is left of the context
            room = max_model_len - count_tokens(prompt)
            if 0 < room < params.max_tokens:
                params = SamplingParams.from_dict({**asdict(params), "max_tokens": room})
        choices.append((prompt, params))
    return BatchRequest(number, custom_id, choices, body.priority or 0, body.user, url, body)
