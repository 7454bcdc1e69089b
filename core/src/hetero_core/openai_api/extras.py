"""vLLM's sampling extras on the OpenAI routes (sent by the ``openai`` client in ``extra_body``), plus
OpenAI's own ``logit_bias``: each becomes the ``SamplingParams`` field of the same name.

The shapes are checked here (strict types, as every request field); the values by ``SamplingParams``
(ranges, ``min_tokens <= max_tokens``) and by the engine when the prompt is tokenized (token ids within
the vocabulary; ``prompt_logprobs`` refused by name on an executor that returns no prompt logits,
such as the mock) -- each a 400 that names the field.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from hetero_core.openai_api.request_model import RequestModel

TokenId = Annotated[int, Field(ge=0)]


class SamplingExtras(RequestModel):
    """Fields beyond OpenAI's that vLLM's server takes (``logit_bias`` is OpenAI's own)."""

    logit_bias: dict[str, float] | None = None  # {token id as a string: bias in [-100, 100]}
    min_tokens: int = Field(0, ge=0)
    stop_token_ids: list[TokenId] | None = None
    bad_words: list[Annotated[str, Field(min_length=1)]] | None = None
    allowed_token_ids: list[TokenId] | None = Field(None, min_length=1)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    prompt_logprobs: int | None = Field(None, ge=0, le=20)

    def sampling_extras(self) -> dict:
        """The fields as ``SamplingParams`` keyword arguments."""
        return {
            "logit_bias": self.logit_bias or None,
            "min_tokens": self.min_tokens,
            "stop_token_ids": tuple(self.stop_token_ids or ()),
            "bad_words": tuple(self.bad_words or ()),
            "allowed_token_ids": None if self.allowed_token_ids is None else tuple(self.allowed_token_ids),
            "skip_special_tokens": self.skip_special_tokens,
            "spaces_between_special_tokens": self.spaces_between_special_tokens,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "prompt_logprobs": self.prompt_logprobs,
        }
