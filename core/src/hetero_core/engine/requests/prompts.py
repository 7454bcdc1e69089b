"""Prompts: what a request may send, checked and turned into token ids before it reaches the engine.

A prompt is one of:
- a string (valid Unicode: a lone surrogate such as ``"\\ud800"`` cannot be encoded);
- a non-empty list (or tuple) of token ids, each an int in ``[0, vocab_size)``;
- a non-empty list of chat messages, dicts with string ``role`` and ``content`` (and optionally
  ``name``), rendered through the tokenizer's chat template;
- a vLLM prompt dict, ``{"prompt": text}`` or ``{"prompt_token_ids": ids}`` (any other dict is refused).
Anything else is an ``InvalidRequestError`` that says what was sent and what is accepted.

``check_prompt_size`` refuses, without tokenizing, a prompt that can never fit ``max_model_len``:
more token ids than that, or a text longer than ``max_model_len`` times the most characters one
token can stand for (the tokenizer's optional ``max_token_chars``).
"""

from __future__ import annotations

import numbers
from typing import Any

from hetero_core.errors import HeteroError, InvalidRequestError

Prompt = str | list[int] | list[dict[str, str]]  # text, token ids, or chat messages

ACCEPTED = (
    "a prompt is a string, a list of token ids or a list of chat messages ({'role': ..., 'content': ...})"
)
MESSAGE_KEYS = ("role", "content", "name")


def as_prompt_list(prompts: Any) -> list:
    """One prompt (a string, a list of token ids, a vLLM prompt dict) as a list of one; a list or
    tuple of prompts as a list. Never iterates a string or a dict."""
    if isinstance(prompts, (str, dict)) or _is_token_ids(prompts):
        return [prompts]
    if isinstance(prompts, (list, tuple)):
        return list(prompts)
    raise InvalidRequestError(
        "prompts must be a string, a list of token ids, a vLLM prompt dict, or a list of prompts (chat "
        f"messages only inside that list); got {type(prompts).__name__}"
    )


def unwrap_prompt(prompt: Any) -> Any:
    """A vLLM prompt dict to the prompt it holds; a tuple to a list; anything else as it is."""
    if isinstance(prompt, dict):
        if len(prompt) == 1 and isinstance(prompt.get("prompt"), str):
            return prompt["prompt"]
        if len(prompt) == 1 and isinstance(prompt.get("prompt_token_ids"), (list, tuple)):
            return list(prompt["prompt_token_ids"])
        keys = ", ".join(repr(k[:40]) if isinstance(k, str) else type(k).__name__ for k in list(prompt)[:5])
        raise InvalidRequestError(
            f"{ACCEPTED}, or a vLLM prompt dict ({{'prompt': text}} or {{'prompt_token_ids': [ids]}}); "
            f"got dict with keys {keys or 'none'}"
        )
    if isinstance(prompt, tuple):
        return list(prompt)
    return prompt


def check_prompt_size(prompt: Any, max_model_len: int, max_token_chars) -> None:
    """InvalidRequestError for a prompt that needs at least ``max_model_len`` tokens, found without
    tokenizing (output needs at least one more). ``max_token_chars``: the most characters one token
    stands for (None: unknown, then only token-id prompts are bounded here), or a function that
    returns it: asked only for a text of at least ``max_model_len`` characters."""
    if not isinstance(prompt, (str, list)) or not prompt:
        return
    if isinstance(prompt, str):
        num_chars, what = len(prompt), "the prompt"
    elif all(isinstance(m, dict) for m in prompt):
        num_chars = sum(len(m["content"]) for m in prompt if isinstance(m.get("content"), str))
        what = "the chat messages' content"
    else:
        if len(prompt) >= max_model_len:
            raise InvalidRequestError(
                f"the prompt has {len(prompt):,} token ids, more than max_model_len ({max_model_len}) "
                "leaves for a prompt (at most max_model_len - 1: the output needs a token)"
            )
        return
    if num_chars < max_model_len:  # fits even at one character per token: no bound needed
        return
    max_token_chars = max_token_chars() if callable(max_token_chars) else max_token_chars
    if max_token_chars and -(-num_chars // max_token_chars) >= max_model_len:
        raise InvalidRequestError(
            f"{what} has {num_chars:,} characters: at least {-(-num_chars // max_token_chars):,} tokens "
            "(one token "
            f"stands for at most {max_token_chars} characters), more than max_model_len ({max_model_len}) "
            "leaves for a prompt; refused without tokenizing"
        )


def decode_prompt(tokenizer, token_ids: list[int]) -> str:
    """The text of a prompt given as token ids or messages (for its outputs)."""
    return _call_tokenizer(tokenizer.decode, token_ids, "decode the prompt")


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


def _is_token_ids(value: Any) -> bool:
    return (
        isinstance(value, (list, tuple))
        and len(value) > 0
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


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
            f"{where}: {'; '.join(problems)}; a chat message has keys {', '.join(MESSAGE_KEYS)} "
            "(name optional)"
        )
    for key in message:
        if not isinstance(message[key], str):
            raise InvalidRequestError(f"{where}: {key!r} must be a string, got {type(message[key]).__name__}")
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


def _call_tokenizer(method, value, what: str = "encode the prompt"):
    """Input-dependent tokenizer failures become the request's error; our own errors pass."""
    try:
        return method(value)
    except HeteroError:
        raise
    except Exception as exc:  # a tokenizer plugin choking on this input fails this request alone
        raise InvalidRequestError(f"the tokenizer could not {what}: {type(exc).__name__}: {exc}") from exc
