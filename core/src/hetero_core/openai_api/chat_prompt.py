"""A chat request's prompt, as the server and batch files give it to the engine: its messages (with the
tools in the system message, ``tools.chat_messages``), or, when vLLM's chat-template extras
``add_generation_prompt`` / ``chat_template_kwargs`` are set, those messages rendered with them into
token ids (``engine/chat_options``: a tokenizer that cannot take an option refuses it by name)."""

from __future__ import annotations

from hetero_core.engine.requests.chat_options import chat_options, encode_chat
from hetero_core.errors import InvalidRequestError
from hetero_core.openai_api.protocol import ChatCompletionRequest
from hetero_core.openai_api.tools import chat_messages


def chat_prompt(body: ChatCompletionRequest, mode: str | None, tokenizer) -> list[dict] | list[int]:
    """The messages, or their token ids when a chat-template option differs from its default."""
    messages = chat_messages(body, mode)
    options = chat_options(body.add_generation_prompt, body.chat_template_kwargs)
    if not options:
        return messages
    if tokenizer is None:
        raise InvalidRequestError(
            f"{', '.join(options)}: rendering the chat template needs the model's tokenizer"
        )
    return encode_chat(tokenizer, messages, options)
