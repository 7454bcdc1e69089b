"""SamplingParams: what a request asks of the sampler, validated once at the edge.

Validation is strict and reports every problem at once, each named by its field: types first (an
int field takes no bool, a float field takes no string; ints are accepted for floats), then ranges.
Values that would make the sampler's arithmetic overflow are made safe or rejected:

- a ``temperature`` below ``GREEDY_TEMPERATURE`` (1e-5, vLLM's ``_SAMPLING_EPS``) is greedy and is
  stored as ``0.0``: dividing logits by 1e-38 would overflow them to inf;
- ``repetition_penalty`` must lie in ``[MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY]``: 0 or a
  denormal divides logits into inf.

As in vLLM, ``stop=None`` and ``stop_token_ids=None`` mean "none"; a single stop string is accepted
as well as a list. ``seed`` takes any Python int (negative or beyond 64 bits). A number too large
for a float (``temperature=10**400``, ``top_p=Fraction(10**400, 3)``) is an InvalidRequestError
naming its field, and messages quote huge values shortened, never as thousands of digits.
"""

from __future__ import annotations

import difflib
import math
import numbers
from dataclasses import dataclass, field, fields
from typing import Any

from hetero_core.engine.requests import params_vllm
from hetero_core.engine.requests.guided import GuidedDecodingParams
from hetero_core.errors import InvalidRequestError

MAX_LOGPROBS = 20
GREEDY_TEMPERATURE = 1e-5
MIN_REPETITION_PENALTY = 1e-4
MAX_REPETITION_PENALTY = 1e4

_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)
_INT_FIELDS = ("top_k", "max_tokens")
_BOOL_FIELDS = ("ignore_eos", "include_stop_str_in_output")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 (or below 1e-5): greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0): disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()  # also accepts a single string, a list, or None
    stop_token_ids: tuple[int, ...] = ()  # also accepts a list or None
    ignore_eos: bool = False
    logprobs: int | None = None  # top-n logprobs per generated token
    seed: int | None = None
    include_stop_str_in_output: bool = False
    # vLLM's further fields (checked in params_vllm; see docs/python-api.md)
    n: int = 1  # completions returned per prompt; they share the prompt's KV blocks
    best_of: int | None = None  # completions generated (>= n); the n with the best cumulative logprob return
    min_tokens: int = 0  # no EOS, stop id or stop string before this many output tokens
    prompt_logprobs: int | None = None  # logprobs of each prompt token and its N best alternatives
    skip_special_tokens: bool = True  # leave special tokens (BOS, EOS, ...) out of the text
    spaces_between_special_tokens: bool = True  # with special tokens kept: a space around each
    bad_words: tuple[str, ...] = ()  # words never generated (a list is accepted)
    allowed_token_ids: tuple[int, ...] | None = None  # only these token ids may be generated
    logit_bias: tuple[tuple[int, float], ...] | None = None  # {token id: bias} added to the logits
    # bad_words as token-id sequences: filled by the engine from bad_words (with the tokenizer)
    bad_words_token_ids: tuple[tuple[int, ...], ...] = field(default=(), repr=False)
    guided_decoding: GuidedDecodingParams | None = None  # structured output (also a dict of its fields)

    @classmethod
    def from_dict(cls, values: Any) -> SamplingParams:
        """Build from a mapping of field names (the vLLM/OpenAI-style convenience); unknown names
        are an InvalidRequestError that lists the valid ones."""
        if not isinstance(values, dict):
            raise InvalidRequestError(
                f"sampling parameters must be a SamplingParams or a dict, got {type(values).__name__}"
            )
        known = [f.name for f in fields(cls)]
        unknown = [k for k in values if k not in known]
        if unknown:
            hints = []
            for key in unknown:
                name = _short(key, repr)
                close = difflib.get_close_matches(name.strip("'"), known, n=1)
                hints.append(name + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise InvalidRequestError(
                f"unknown sampling parameter {', '.join(hints)}; valid: {', '.join(known)}"
            )
        return cls(**values)

    def __post_init__(self) -> None:
        problems = list(self._type_problems())
        if not problems:
            given = {f.name: _short(getattr(self, f.name)) for f in fields(self)}
            problems = list(self._float_problems(given))
        if not problems:
            self._normalise()
            problems = list(self._range_problems(given))
        if not problems:
            problems = list(params_vllm.type_problems(self))
        if not problems:
            params_vllm.normalise(self)
            problems = list(params_vllm.range_problems(self))
        if problems:
            raise InvalidRequestError("invalid sampling parameters: " + "; ".join(problems))

    def _type_problems(self):
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if not _is_number(value):
                yield f"{name} must be a number, got {_describe(value)}"
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if not _is_int(value):
                yield f"{name} must be an integer, got {_describe(value)}"
        for name in _BOOL_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                yield f"{name} must be true or false, got {_describe(value)}"
        for name in ("logprobs", "seed"):
            value = getattr(self, name)
            if value is not None and not _is_int(value):
                yield f"{name} must be an integer or None, got {_describe(value)}"
        stop = self.stop
        if not (stop is None or isinstance(stop, str) or _is_list_of(stop, lambda s: isinstance(s, str))):
            yield f"stop must be a string, a list of strings or None, got {_describe(stop)}"
        if not (self.stop_token_ids is None or _is_list_of(self.stop_token_ids, _is_int)):
            yield f"stop_token_ids must be a list of integers or None, got {_describe(self.stop_token_ids)}"
        try:
            GuidedDecodingParams.coerce(self.guided_decoding)
        except InvalidRequestError as exc:
            yield str(exc)

    def _float_problems(self, given: dict[str, str]):
        """A float field whose value has no float (an int or fraction beyond 1.8e308)."""
        for name in _FLOAT_FIELDS:
            try:
                float(getattr(self, name))
            except (OverflowError, ValueError, TypeError, ArithmeticError):
                yield f"{name} must be a number within the float range (about 1.8e308), got {given[name]}"

    def _normalise(self) -> None:
        """Store plain Python types: floats, ints, tuples (hashable, immutable)."""
        set_ = object.__setattr__
        for name in _FLOAT_FIELDS:
            set_(self, name, float(getattr(self, name)))
        for name in (*_INT_FIELDS, "logprobs", "seed"):
            value = getattr(self, name)
            set_(self, name, None if value is None else int(value))
        stop = self.stop
        set_(self, "stop", () if stop is None else (stop,) if isinstance(stop, str) else tuple(stop))
        set_(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids or ()))
        set_(self, "guided_decoding", GuidedDecodingParams.coerce(self.guided_decoding))
        if 0 <= self.temperature < GREEDY_TEMPERATURE:
            set_(self, "temperature", 0.0)  # greedy, as vLLM treats temperatures below 1e-5

    def _range_problems(self, given: dict[str, str]):
        """Checked on the normalised values; messages quote the values as given."""
        if not self.temperature >= 0:
            yield f"temperature must be >= 0, got {given['temperature']}"
        elif not math.isfinite(self.temperature):
            yield f"temperature must be finite (0 is greedy), got {given['temperature']}"
        if not 0 < self.top_p <= 1:
            yield f"top_p must be in (0, 1], got {given['top_p']}"
        if self.top_k < -1:
            yield f"top_k must be -1 (disabled), 0 (disabled) or >= 1, got {given['top_k']}"
        if not 0 <= self.min_p <= 1:
            yield f"min_p must be in [0, 1], got {given['min_p']}"
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY:
            yield (
                f"repetition_penalty must be between {MIN_REPETITION_PENALTY:g} and "
                f"{MAX_REPETITION_PENALTY:g} "
                f"(1: off; 0 or a denormal would overflow the logits), got {given['repetition_penalty']}"
            )
        if not -2 <= self.presence_penalty <= 2:
            yield f"presence_penalty must be in [-2, 2], got {given['presence_penalty']}"
        if not -2 <= self.frequency_penalty <= 2:
            yield f"frequency_penalty must be in [-2, 2], got {given['frequency_penalty']}"
        if self.max_tokens < 1:
            yield f"max_tokens must be >= 1, got {given['max_tokens']}"
        if any(not s for s in self.stop):
            yield "stop strings must be non-empty strings"
        elif any(_has_lone_surrogate(s) for s in self.stop):
            yield "stop strings must be valid Unicode (one contains a lone surrogate)"
        if any(t < 0 for t in self.stop_token_ids):
            yield "stop_token_ids must be non-negative integers"
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            yield f"logprobs must be in [0, {MAX_LOGPROBS}], got {given['logprobs']}"

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def num_samples(self) -> int:
        """Completions generated for the prompt: ``best_of`` or ``n``."""
        return self.best_of if self.best_of is not None else self.n

    @property
    def has_token_constraints(self) -> bool:
        """Whether the sampler must edit this request's logits before choosing (``logits_constraints``)."""
        return bool(
            self.min_tokens
            or self.bad_words_token_ids
            or self.allowed_token_ids is not None
            or self.logit_bias
        )

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_list_of(value: Any, check) -> bool:
    return isinstance(value, (list, tuple)) and all(check(v) for v in value)


def _has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _describe(value: Any) -> str:
    return f"{_short(value, repr)} ({type(value).__name__})"


def _short(value: Any, form=str, limit: int = 40) -> str:
    """``form(value)`` cut to ``limit`` characters; a number too long to print says its size."""
    if _is_int(value) and value.bit_length() > 128:
        return f"{'a negative' if value < 0 else 'an'} integer of {value.bit_length()} bits"
    try:
        text = form(value)
    except ValueError:  # e.g. a Fraction beyond Python's 4,300-digit int-to-str limit
        return f"a {type(value).__name__} too large to print"
    return text if len(text) <= limit else text[: limit - 3] + "..."
