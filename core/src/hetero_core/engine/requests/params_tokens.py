"""The checks of SamplingParams that need the tokenizer, made when a request is tokenized.

- ``allowed_token_ids``, ``logit_bias`` and ``bad_words_token_ids`` must name ids of the vocabulary;
- ``bad_words`` become ``bad_words_token_ids`` as vLLM makes them: each word is encoded as it
  stands at the start of a text and, when that gives other tokens, with a leading space (as in the
  middle of a text); the sampler bans a word's last token when the output ends with the others;
- ``skip_special_tokens=False`` needs a tokenizer whose ``decode`` takes that keyword;
- the tokenizer's own stop ids (its optional ``stop_token_ids``: the other end-of-turn tokens of
  generation_config.json's ``eos_token_id`` list, Llama 3's ``<|eot_id|>``, Qwen's ``<|im_end|>``)
  join the request's ``stop_token_ids`` unless ``ignore_eos``, as vLLM adds them to every request.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

from hetero_core.engine.requests.params import SamplingParams
from hetero_core.errors import InvalidRequestError


def resolve_token_params(params: SamplingParams, tokenizer) -> SamplingParams:
    """``params`` checked against the tokenizer's vocabulary, with ``bad_words`` as token ids."""
    vocab_size = tokenizer.vocab_size
    outside = [t for t in params.allowed_token_ids or () if t >= vocab_size]
    outside += [t for t, _ in params.logit_bias or () if t >= vocab_size]
    outside += [t for ids in params.bad_words_token_ids for t in ids if t >= vocab_size]
    if outside:
        raise InvalidRequestError(
            f"token ids {sorted(set(outside))[:5]} in allowed_token_ids / logit_bias / "
            "bad_words_token_ids are "
            f"outside the vocabulary [0, {vocab_size})"
        )
    if not params.skip_special_tokens and not decode_keeps_special_tokens(tokenizer):
        raise InvalidRequestError(
            f"skip_special_tokens=False: the tokenizer {type(tokenizer).__name__} cannot show special tokens "
            "(its decode takes no skip_special_tokens); leave it True"
        )
    params = with_tokenizer_stop_ids(params, tokenizer)
    if not params.bad_words:
        return params
    words = list(params.bad_words_token_ids)
    for word in params.bad_words:
        words += [ids for ids in bad_word_token_ids(tokenizer, word) if ids not in words]
    return replace(params, bad_words_token_ids=tuple(words), bad_words=params.bad_words)


def with_tokenizer_stop_ids(params: SamplingParams, tokenizer) -> SamplingParams:
    """``params`` with the tokenizer's stop ids added to its ``stop_token_ids`` (none with ``ignore_eos``:
    like EOS they then end nothing)."""
    extra = getattr(tokenizer, "stop_token_ids", None) or ()
    if params.ignore_eos or not extra:
        return params
    merged = tuple(dict.fromkeys((*params.stop_token_ids, *(int(t) for t in extra))))
    return params if merged == params.stop_token_ids else replace(params, stop_token_ids=merged)


def bad_word_token_ids(tokenizer, word: str) -> list[tuple[int, ...]]:
    """The token sequences that spell ``word``: at the start of a text, and after a space."""
    word = word.lstrip()
    plain = tuple(tokenizer.encode(word))
    spaced = tuple(tokenizer.encode(" " + word))
    found = [plain] if plain else []
    if spaced and spaced != plain and (not plain or spaced[0] != plain[0]):
        found.append(spaced)
    return found


def decode_keeps_special_tokens(tokenizer) -> bool:
    try:
        return "skip_special_tokens" in inspect.signature(tokenizer.decode).parameters
    except (TypeError, ValueError):
        return False
