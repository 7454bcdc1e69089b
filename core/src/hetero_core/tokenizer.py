"""What a tokenizer author imports: the protocol the engine calls and the context a factory receives.
See docs/hooks.md (``register_tokenizers``); test a tokenizer with ``hetero_core.testing.TokenizerContract``.

    from hetero_core import hookimpl
    from hetero_core.tokenizer import TokenizerContext

    @hookimpl
    def register_tokenizers(register):
        register("my-tokenizer", lambda ctx: MyTokenizer(ctx.model_dir))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

# ``hookimpl`` is ``hetero_core.hookimpl``, kept here for the code that imported it from this facade
from hetero_core.plugin_system.hookspecs import hookimpl as hookimpl

__all__ = ["Tokenizer", "TokenizerContext"]


@runtime_checkable
class Tokenizer(Protocol):
    """Turns text into token ids and back.

    ``decode`` must be a pure function of its ids; the engine's incremental detokenizer
    (``hetero_core.engine.requests.detokenizer``) builds streaming text on top of it. ``encode``,
    ``encode_chat`` and ``decode`` may be called from several threads at once (``AsyncLLM``
    tokenizes a request in its caller's thread while the engine loop decodes).

    Optional: ``max_token_chars`` (int or None), the most characters of input text one token can
    stand for; with it the engine refuses, without tokenizing, a text longer than ``max_model_len``
    times that. Leave it out (or None) when no such bound holds (a tokenizer that can map a long
    run of text to one token, or drop text).

    Optional: ``stop_token_ids`` (a sequence of ids), more tokens that end a request as EOS does (the
    other end-of-turn tokens of the model, e.g. Llama 3's ``<|eot_id|>`` beside its EOS): the engine
    adds them to each request's ``stop_token_ids`` unless ``ignore_eos``.

    Optional keywords (vLLM's request options; a tokenizer without them refuses those requests with
    its name): ``decode(ids, skip_special_tokens=True, spaces_between_special_tokens=True)`` and
    ``encode_chat(messages, add_generation_prompt=True, tools=None, chat_template_kwargs=None)``.
    """

    eos_token_id: int | None
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Apply the model's chat template (with the generation prompt) and encode.

        Raise ``hetero_core.errors.InvalidRequestError`` if the tokenizer has no chat template.
        """
        ...


@dataclass(frozen=True)
class TokenizerContext:
    """What a tokenizer factory receives."""

    options: Any  # the plugin's validated options model instance, or None
    model_dir: Path | None  # local model directory when the executor runs a real model
