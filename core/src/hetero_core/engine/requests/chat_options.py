"""Chat-template options (vLLM's ``LLM.chat`` keywords): ``add_generation_prompt``,
``chat_template_kwargs`` and ``tools``, checked and passed to the tokenizer's ``encode_chat``.

A tokenizer takes them as keywords of ``encode_chat`` (the hf tokenizer hands them to the jinja
template: ``tools`` as the template's ``tools`` variable, each of ``chat_template_kwargs`` as a
variable of its own); a tokenizer whose ``encode_chat`` takes no such keyword is refused with its
name, never silently ignored. With no option set nothing is passed, so any tokenizer works.
"""

from __future__ import annotations

import inspect
from typing import Any

from hetero_core.errors import HeteroError, InvalidRequestError

__all__ = ["chat_options", "encode_chat"]


def chat_options(
    add_generation_prompt: bool = True,
    chat_template_kwargs: dict[str, Any] | None = None,
    tools: list[dict] | None = None,
) -> dict[str, Any]:
    """The options that differ from the defaults, checked; ``{}`` when none does."""
    if not isinstance(add_generation_prompt, bool):
        raise InvalidRequestError(
            f"add_generation_prompt must be true or false, got {add_generation_prompt!r:.40}"
        )
    if chat_template_kwargs is not None and not (
        isinstance(chat_template_kwargs, dict) and all(isinstance(k, str) for k in chat_template_kwargs)
    ):
        raise InvalidRequestError(
            "chat_template_kwargs must be a dict of template variable names to values, "
            f"got {chat_template_kwargs!r:.60}"
        )
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise InvalidRequestError(
            "tools must be a list of tool definitions (dicts such as {'type': 'function', "
            "'function': {...}}), "
            f"got {tools!r:.60}"
        )
    options: dict[str, Any] = {}
    if not add_generation_prompt:
        options["add_generation_prompt"] = False
    if chat_template_kwargs:
        options["chat_template_kwargs"] = dict(chat_template_kwargs)
    if tools is not None:
        options["tools"] = list(tools)
    return options


def encode_chat(tokenizer, messages: list[dict], options: dict[str, Any]) -> list[int]:
    """``tokenizer.encode_chat(messages, **options)``; InvalidRequestError when the tokenizer takes
    no such option or its template rejects the conversation."""
    try:
        accepted = inspect.signature(tokenizer.encode_chat).parameters
    except (TypeError, ValueError):
        accepted = {}
    missing = [name for name in options if name not in accepted]
    if missing:
        raise InvalidRequestError(
            f"the tokenizer {type(tokenizer).__name__} takes no chat option {', '.join(missing)} "
            "(its encode_chat has no such keyword); leave it out, or use a tokenizer with a chat "
            "template (hf)"
        )
    try:
        return list(tokenizer.encode_chat(messages, **options))
    except HeteroError:
        raise
    except Exception as exc:  # a template choking on these messages fails this call alone
        raise InvalidRequestError(
            f"the chat template could not render the conversation: {type(exc).__name__}: {exc}"
        ) from exc
