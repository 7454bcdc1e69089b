"""Incremental detokenization: streaming text from token ids through ``Tokenizer.decode`` only.

The vLLM scheme with a prefix and a read offset, kept as a short window of token ids: the window
starts at vLLM's ``prefix_offset`` (the tokens of the previous delta, or the prompt's last few
tokens) and ``read_offset`` marks where the text already handed out ends. Each step decodes the
window and hands out what it adds to the decode of ``window[:read_offset]``. The context keeps
tokens that merge with their neighbour right (SentencePiece's "▁word" gets its space, byte-level
BPE joins bytes across tokens), and a window whose text ends in U+FFFD (a multi-byte UTF-8
character split over tokens) is held back until a later token completes it. Each step makes two
decode calls over a few tokens: the cost per token does not grow with the length of the output.

Guarantee: for a tokenizer whose decode of a window is the concatenation of its tokens' texts
(byte-level BPE such as GPT-2 / SmolLM2, the byte tokenizer) and a prompt that ends on a
character boundary, ``text`` after ``flush()`` equals ``tokenizer.decode(output_ids)``, and no
delta contains a U+FFFD that the final text does not. Exceptions:

- SentencePiece-style decoders drop the leading space of the first token of a decode call; the
  first output token is decoded after the prompt's tail, so its leading space is kept (``text``
  is ``" Hello"`` where ``decode(output_ids)`` is ``"Hello"``): the text as it continues the
  prompt, i.e. what ``decode(prompt_tail + output_ids)`` adds to ``decode(prompt_tail)``.
- A prompt that ends inside a multi-byte character: the character its first output tokens
  complete counts as prompt text, not output (prompt ``[0xE4]`` + output ``[0xBD, 0xA0, 0x61]``
  streams ``"a"`` where ``decode(output_ids)`` is ``"\ufffd\ufffda"``).
- If a window stays unfinished for more than ``MAX_HELD_TOKENS`` tokens (only possible for
  output that is not valid UTF-8), its text is handed out as is, U+FFFD included.
- Output that stops inside a multi-byte character: ``flush()`` drops the cut character (its
  U+FFFD), so ``text`` ends on the last whole character. ``decode`` cannot tell a cut character
  from a real U+FFFD, so a replacement character at the very end of the output is dropped too
  (vLLM's detokenizer does the same).

Options (``SamplingParams``): ``skip_special_tokens=False`` keeps special tokens (BOS, EOS, chat
markers) in the text, and then ``spaces_between_special_tokens`` puts a space between each special
token and its neighbours, as transformers does; both are passed to ``Tokenizer.decode`` as keywords,
only when they differ from the defaults (a tokenizer without them is refused when the request is
tokenized, ``params_tokens``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from hetero_core.tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens decoded as context before the first output token.
INITIAL_CONTEXT_TOKENS = 5
# A UTF-8 character is at most 4 bytes; hold an unfinished tail this many tokens at most.
MAX_HELD_TOKENS = 16


class IncrementalDetokenizer:
    """Turns one request's output tokens into text deltas, one token at a time."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int],
        params=None,
        token_texts: dict[int, str] | None = None,
    ) -> None:
        self._decode = tokenizer.decode
        if params is not None and not params.skip_special_tokens:
            self._decode = partial(
                tokenizer.decode,
                skip_special_tokens=False,
                spaces_between_special_tokens=params.spaces_between_special_tokens,
            )
            token_texts = None  # the shared single-token texts are decoded with the defaults
        # decode([token]) by token, shared by the requests of one tokenizer: a window's context is
        # usually the one token handed out last, so one decode call per token instead of two
        self._token_texts = token_texts
        self._token_ids: list[int] = list(prompt_token_ids[-INITIAL_CONTEXT_TOKENS:])
        self._read_offset = len(self._token_ids)
        self._pieces: list[str] = []

    @property
    def text(self) -> str:
        """All output text handed out so far."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    @property
    def num_held_tokens(self) -> int:
        """Output tokens whose text has not been handed out yet."""
        return len(self._token_ids) - self._read_offset

    def add(self, token_id: int) -> str:
        """Add the next output token; return the newly completed text (may be "")."""
        self._token_ids.append(token_id)
        prefix_text, new_text = self._decode_window()
        if new_text.endswith(REPLACEMENT_CHAR) and self.num_held_tokens <= MAX_HELD_TOKENS:
            return ""  # an unfinished multi-byte character: wait for the rest
        if len(new_text) <= len(prefix_text) and self.num_held_tokens <= MAX_HELD_TOKENS:
            return ""  # nothing visible yet (e.g. a skipped special token)
        return self._advance(new_text[len(prefix_text) :])

    def flush(self) -> str:
        """Hand out any held-back text (call once the request has finished).

        A character cut short by the end of the output (the U+FFFD its lone bytes decode to at the
        very end) is dropped: the final text never ends in a cut character.
        """
        if self.num_held_tokens == 0:
            return ""
        prefix_text, new_text = self._decode_window()
        return self._advance(new_text[len(prefix_text) :].rstrip(REPLACEMENT_CHAR))

    def _decode_window(self) -> tuple[str, str]:
        decode = self._decode
        if self._read_offset == 1 and self._token_texts is not None:
            token_id = self._token_ids[0]
            prefix_text = self._token_texts.get(token_id)
            if prefix_text is None:
                prefix_text = self._token_texts[token_id] = decode([token_id])
            return prefix_text, decode(self._token_ids)
        return decode(self._token_ids[: self._read_offset]), decode(self._token_ids)

    def _advance(self, delta: str) -> str:
        # The tokens just handed out become the next window's context (vLLM's
        # prefix_offset = read_offset); older ones are dropped, so the window stays short.
        del self._token_ids[: self._read_offset]
        self._read_offset = len(self._token_ids)
        if delta:
            self._pieces.append(delta)
        return delta
