"""TokenTexts: the tokenizer's text of each single token decoded so far, kept per tokenizer.

Detokenizers read it for the one-token context of a window (``detokenizer``), prompt logprobs for
the text of a token (``prompt_logprobs``); a new tokenizer (a test or a caller swapping
``engine.processor.tokenizer``) starts an empty table.
"""

from __future__ import annotations

__all__ = ["TokenTexts"]


class TokenTexts:
    def __init__(self) -> None:
        self._tokenizer = None
        self._texts: dict[int, str] = {}

    def of(self, tokenizer) -> dict[int, str]:
        """The texts decoded so far by ``tokenizer`` (a dict the caller may add to)."""
        if self._tokenizer is not tokenizer:
            self._tokenizer, self._texts = tokenizer, {}
        return self._texts

    def text(self, tokenizer, token_id: int) -> str:
        texts = self.of(tokenizer)
        if token_id not in texts:
            texts[token_id] = tokenizer.decode([token_id])
        return texts[token_id]
