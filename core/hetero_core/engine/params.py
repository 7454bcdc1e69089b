"""SamplingParams: what a request asks of the sampler, validated once at the edge."""

from __future__ import annotations

from dataclasses import dataclass, field

from hetero_core.errors import InvalidRequestError

MAX_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0): disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # top-n logprobs per generated token
    seed: int | None = None
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        # Accept lists / a single string from callers and store tuples (hashable, immutable).
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        problems = list(self._problems())
        if problems:
            raise InvalidRequestError("invalid sampling parameters: " + "; ".join(problems))

    def _problems(self):
        if not self.temperature >= 0:
            yield f"temperature must be >= 0, got {self.temperature}"
        if not 0 < self.top_p <= 1:
            yield f"top_p must be in (0, 1], got {self.top_p}"
        if not isinstance(self.top_k, int) or self.top_k < -1:
            yield f"top_k must be -1 (disabled), 0 (disabled) or >= 1, got {self.top_k}"
        if not 0 <= self.min_p <= 1:
            yield f"min_p must be in [0, 1], got {self.min_p}"
        if not self.repetition_penalty > 0:
            yield f"repetition_penalty must be > 0, got {self.repetition_penalty}"
        if not -2 <= self.presence_penalty <= 2:
            yield f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"
        if not -2 <= self.frequency_penalty <= 2:
            yield f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            yield f"max_tokens must be >= 1, got {self.max_tokens}"
        if any(not isinstance(s, str) or not s for s in self.stop):
            yield "stop strings must be non-empty strings"
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            yield "stop_token_ids must be non-negative integers"
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            yield f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}"
        if self.seed is not None and not isinstance(self.seed, int):
            yield f"seed must be an integer, got {self.seed!r}"

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )
