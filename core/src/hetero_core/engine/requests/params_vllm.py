"""The checks of SamplingParams' vLLM fields: ``n``, ``best_of``, ``min_tokens``, ``prompt_logprobs``,
the detokenizer switches, ``bad_words``, ``allowed_token_ids`` and ``logit_bias``.

Called by ``SamplingParams.__post_init__`` after its own checks passed, in the same three passes
(types, then normalising to plain immutable values, then ranges); the problems join its one
``InvalidRequestError``. What needs the tokenizer (token ids within the vocabulary, bad words as
token ids) is checked when the request is tokenized (``params_tokens``).

As in vLLM: ``best_of`` defaults to ``n`` and must be at least ``n``; ``min_tokens`` at most
``max_tokens``; ``logit_bias`` maps token ids (ints, or strings of digits as JSON sends them) to a
bias in [-100, 100] (OpenAI's range), stored as ``((token_id, bias), ...)`` sorted by id so the
parameters stay hashable; ``allowed_token_ids`` is a non-empty list.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

MAX_N = 128  # completions per prompt (n and best_of)
MAX_LOGIT_BIAS = 100.0
_BOOLS = ("skip_special_tokens", "spaces_between_special_tokens")


def type_problems(p) -> list[str]:
    problems = []
    if not _is_int(p.n):
        problems.append(f"n must be an integer, got {_describe(p.n)}")
    for name in ("best_of", "prompt_logprobs"):
        value = getattr(p, name)
        if value is not None and not _is_int(value):
            problems.append(f"{name} must be an integer or None, got {_describe(value)}")
    if not _is_int(p.min_tokens):
        problems.append(f"min_tokens must be an integer, got {_describe(p.min_tokens)}")
    for name in _BOOLS:
        if not isinstance(getattr(p, name), bool):
            problems.append(f"{name} must be true or false, got {_describe(getattr(p, name))}")
    words = p.bad_words
    if not (words is None or isinstance(words, str) or _is_list_of(words, lambda w: isinstance(w, str))):
        problems.append(f"bad_words must be a list of strings or None, got {_describe(words)}")
    if not (p.allowed_token_ids is None or _is_list_of(p.allowed_token_ids, _is_int)):
        problems.append(
            f"allowed_token_ids must be a list of token ids or None, got {_describe(p.allowed_token_ids)}"
        )
    if not _is_list_of(p.bad_words_token_ids, lambda ids: _is_list_of(ids, _is_int)):
        problems.append(
            "bad_words_token_ids must be a list of lists of token ids, "
            f"got {_describe(p.bad_words_token_ids)}"
        )
    if p.logit_bias is not None and _bias_pairs(p.logit_bias) is None:
        problems.append(
            "logit_bias must be a dict of token id (an int, or a string of digits) to a number, "
            f"got {_describe(p.logit_bias)}"
        )
    return problems


def normalise(p) -> None:
    """Plain, immutable, hashable values (ints, tuples)."""
    set_ = object.__setattr__
    for name in ("n", "min_tokens", "best_of", "prompt_logprobs"):
        value = getattr(p, name)
        set_(p, name, None if value is None else int(value))
    words = p.bad_words
    set_(p, "bad_words", () if words is None else (words,) if isinstance(words, str) else tuple(words))
    if p.allowed_token_ids is not None:
        set_(p, "allowed_token_ids", tuple(int(t) for t in p.allowed_token_ids))
    set_(p, "bad_words_token_ids", tuple(tuple(int(t) for t in ids) for ids in p.bad_words_token_ids))
    if p.logit_bias is not None:
        set_(p, "logit_bias", _bias_pairs(p.logit_bias) or None)


def range_problems(p) -> list[str]:
    problems = []
    if not 1 <= p.n <= MAX_N:
        problems.append(f"n must be in [1, {MAX_N}], got {p.n}")
    if p.best_of is not None and not p.n <= p.best_of <= MAX_N:
        problems.append(f"best_of must be in [n, {MAX_N}] (n = {p.n}), got {p.best_of}")
    if p.min_tokens < 0:
        problems.append(f"min_tokens must be >= 0, got {p.min_tokens}")
    elif p.min_tokens > p.max_tokens:
        problems.append(f"min_tokens ({p.min_tokens}) must be at most max_tokens ({p.max_tokens})")
    if p.prompt_logprobs is not None and not 0 <= p.prompt_logprobs <= 20:
        problems.append(f"prompt_logprobs must be in [0, 20], got {p.prompt_logprobs}")
    if any(not w.strip() for w in p.bad_words):
        problems.append("bad_words must be non-empty words (not only spaces)")
    if p.allowed_token_ids is not None and not p.allowed_token_ids:
        problems.append("allowed_token_ids must not be empty (None: every token is allowed)")
    if p.allowed_token_ids is not None and any(t < 0 for t in p.allowed_token_ids):
        problems.append("allowed_token_ids must be non-negative token ids")
    if any(not ids or any(t < 0 for t in ids) for ids in p.bad_words_token_ids):
        problems.append("bad_words_token_ids must be non-empty lists of non-negative token ids")
    for token_id, bias in p.logit_bias or ():
        if token_id < 0:
            problems.append(f"logit_bias token ids must be non-negative, got {token_id}")
            break
        if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            problems.append(f"logit_bias values must be in [-100, 100], got {bias:g} for token {token_id}")
            break
    return problems


def _bias_pairs(value: Any) -> tuple[tuple[int, float], ...] | None:
    """``{id: bias}`` (or ``((id, bias), ...)``) as sorted pairs; None when it is not one."""
    items = value.items() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else None
    if items is None:
        return None
    pairs = {}
    for item in items:
        if not (isinstance(item, (list, tuple)) and len(item) == 2):
            return None
        key, bias = item
        if isinstance(key, str) and key.strip().lstrip("-").isdecimal():  # isdigit would take "²"
            try:
                key = int(key)
            except ValueError:  # beyond Python's 4,300-digit limit
                return None
        if not _is_int(key) or not isinstance(bias, numbers.Real) or isinstance(bias, bool):
            return None
        try:
            bias = float(bias)
        except (OverflowError, ValueError):
            return None
        if math.isnan(bias):
            return None
        pairs[int(key)] = bias
    return tuple(sorted(pairs.items()))


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_list_of(value: Any, check) -> bool:
    return isinstance(value, (list, tuple)) and all(check(v) for v in value)


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{text if len(text) <= 40 else text[:37] + '...'} ({type(value).__name__})"
