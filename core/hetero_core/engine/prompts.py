"""Prompts: what a request may send, checked and turned into token ids before it reaches the engine.

A prompt is one of:
- a string (valid Unicode: a lone surrogate such as ``"\\ud800"`` cannot be encoded);
- a non-empty list (or tuple) of token ids, each an int in ``[0, vocab_size)``;
- a non-empty list of chat messages, dicts with string ``role`` and ``content`` (and optionally
  ``name``), rendered through the tokenizer's chat template.
Anything else is an ``InvalidRequestError`` that says what was sent and what is accepted.
"""

from __future__ import annotations

import numbers
from typing import Any

from hetero_core.errors import HeteroError, InvalidRequestError

Prompt = str | list[int] | list[dict[str, str]]  # text, token ids, or chat messages

ACCEPTED = "a prompt is a string, a list of token ids or a list of chat messages ({'role': ..., 'content': ...})"
MESSAGE_KEYS = ("role", "content", "name")


def tokenize_prompt(tokenizer, prompt: Any) -> list[int]:
    """The prompt's token ids, or InvalidRequestError naming the problem."""
    if isinstance(prompt, str):
        _check_text(prompt, "the prompt")
        token_ids = _call_tokenizer(tokenizer.encode, prompt)
    elif isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
        for index, message in enumerate(prompt):
            _check_message(index, message)
        token_ids = _call_tokenizer(tokenizer.encode_chat, [dict(m) for m in prompt])
    elif isinstance(prompt, (list, tuple)) and prompt:
        token_ids = _check_token_ids(prompt, tokenizer.vocab_size)
    elif isinstance(prompt, (list, tuple)):
        raise InvalidRequestError("the prompt is empty")
    else:
        raise InvalidRequestError(f"{ACCEPTED}; got {type(prompt).__name__}")
    if not token_ids:
        raise InvalidRequestError("the prompt is empty")
    return list(token_ids)


def prompt_text(prompt: Any) -> str:
    """A printable form of any prompt, for outputs of requests that failed before tokenizing."""
    if isinstance(prompt, str):
        return prompt.encode("utf-8", errors="replace").decode("utf-8")
    return ""


def _check_token_ids(prompt: list | tuple, vocab_size: int) -> list[int]:
    not_ints = [t for t in prompt if not isinstance(t, numbers.Integral) or isinstance(t, bool)]
    if not_ints:
        kinds = sorted({type(t).__name__ for t in not_ints})
        raise InvalidRequestError(
            f"{ACCEPTED}; this list holds {', '.join(kinds)} items (token ids must be ints, "
            "messages must all be dicts)"
        )
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(f"prompt token ids out of range [0, {vocab_size}): {bad[:5]}")
    return [int(t) for t in prompt]


def _check_message(index: int, message: dict) -> None:
    where = f"message {index}"
    missing = [k for k in ("role", "content") if k not in message]
    unknown = [k for k in message if k not in MESSAGE_KEYS]
    if missing or unknown:
        problems = ([f"missing {', '.join(map(repr, missing))}"] if missing else []) + (
            [f"unknown key {', '.join(map(repr, unknown))}"] if unknown else []
        )
        raise InvalidRequestError(
            f"{where}: {'; '.join(problems)}; a chat message has keys {', '.join(MESSAGE_KEYS)} (name optional)"
        )
    for key in message:
        if not isinstance(message[key], str):
            raise InvalidRequestError(
                f"{where}: {key!r} must be a string, got {type(message[key]).__name__}"
            )
        _check_text(message[key], f"{where} {key!r}")
    if not message["role"]:
        raise InvalidRequestError(f"{where}: 'role' is empty (e.g. 'system', 'user', 'assistant')")


def _check_text(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(
            f"{what} is not valid Unicode: a lone surrogate {text[exc.start]!r} at index {exc.start}"
        ) from None


def _call_tokenizer(method, value):
    """Input-dependent tokenizer failures become the request's error; our own errors pass."""
    try:
        return method(value)
    except HeteroError:
        raise
    except Exception as exc:  # a tokenizer plugin choking on this input fails this request alone
        raise InvalidRequestError(f"the tokenizer could not encode the prompt: {type(exc).__name__}: {exc}") from exc
