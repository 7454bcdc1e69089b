"""The byte tokenizer: one token per UTF-8 byte, plus BOS and EOS. No model files, no imports.

Ids 0..255 are the bytes themselves, 256 is BOS and 257 is EOS. Any text round-trips through
``encode`` / ``decode``; decoding bytes that are not valid UTF-8 gives U+FFFD for them.
"""

from __future__ import annotations

from collections.abc import Sequence

from hetero_core.errors import InvalidRequestError
from hetero_core.tokenizer import TokenizerContext

NUM_BYTES = 256
BOS_TOKEN_ID = 256
EOS_TOKEN_ID = 257
VOCAB_SIZE = 258
SPECIAL_TEXT = {BOS_TOKEN_ID: b"<s>", EOS_TOKEN_ID: b"</s>"}


class ByteTokenizer:
    """Implements ``hetero_core.tokenizer.Tokenizer`` over raw UTF-8 bytes."""

    eos_token_id: int | None = EOS_TOKEN_ID
    bos_token_id: int = BOS_TOKEN_ID
    vocab_size: int = VOCAB_SIZE
    max_token_chars: int = 1  # a token is one byte, and a character at least one byte

    def grammar_vocab(self) -> list[bytes]:
        """What each id stands for, as bytes (b"" for BOS and EOS), for structured-output backends."""
        return [bytes([i]) for i in range(NUM_BYTES)] + [b"", b""]

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of ``text`` (no BOS)."""
        return list(text.encode("utf-8"))

    def decode(
        self,
        token_ids: Sequence[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        """Bytes back to text; BOS and EOS are dropped (``skip_special_tokens=False``: shown as
        ``<s>`` and ``</s>``, spaced from their neighbours unless ``spaces_between_special_tokens``
        is False), invalid UTF-8 becomes U+FFFD."""
        parts, out = [], bytearray()
        for token_id in token_ids:
            if 0 <= token_id < NUM_BYTES:
                out.append(token_id)
            elif token_id in SPECIAL_TEXT and not skip_special_tokens:
                parts += [out, SPECIAL_TEXT[token_id]] if out else [SPECIAL_TEXT[token_id]]
                out = bytearray()
            elif token_id not in (BOS_TOKEN_ID, EOS_TOKEN_ID):
                raise InvalidRequestError(
                    f"token id {token_id} is out of range for the byte tokenizer "
                    f"(valid ids: 0..{VOCAB_SIZE - 1})"
                )
        parts += [out] if out or not parts else []
        joined = (b" " if spaces_between_special_tokens else b"").join(parts)
        return joined.decode("utf-8", errors="replace")

    def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """Render ``"<role>: <content>\\n"`` per message, then ``"assistant: "`` (unless
        ``add_generation_prompt=False``), and encode."""
        text = render_plain_chat(messages)
        return self.encode(text if add_generation_prompt else text.removesuffix("assistant: "))


def render_plain_chat(messages: list[dict[str, str]]) -> str:
    """The byte tokenizer's chat template, checked for the shape a chat request must have."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("a chat request needs a non-empty list of messages")
    lines = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequestError(f"message {i} must be an object with 'role' and 'content'")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            raise InvalidRequestError(f"message {i} needs a non-empty string 'role'")
        if not isinstance(content, str):
            raise InvalidRequestError(f"message {i} needs a string 'content'")
        lines.append(f"{role}: {content}\n")
    return "".join(lines) + "assistant: "


def create_byte_tokenizer(ctx: TokenizerContext) -> ByteTokenizer:
    """Factory for the ``byte`` tokenizer; it takes no options and needs no model."""
    return ByteTokenizer()
