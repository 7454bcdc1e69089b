"""RequestMetrics: a request's timings (wall-clock seconds, ``time.time()``) and what follows."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestMetrics:
    arrival_time: float  # when the engine accepted the request
    first_token_time: float | None  # when its first output token was produced
    finished_time: float | None  # when it finished, was aborted or failed
    num_prompt_tokens: int
    num_output_tokens: int

    @property
    def time_to_first_token(self) -> float | None:
        """Seconds from arrival to the first output token (None before it, or if there was none)."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def latency(self) -> float | None:
        """Seconds from arrival to the end (None while running)."""
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    @property
    def decode_tokens_per_second(self) -> float | None:
        """Output tokens after the first, per second after the first (None if undefined)."""
        if self.first_token_time is None or self.finished_time is None or self.num_output_tokens < 2:
            return None
        seconds = self.finished_time - self.first_token_time
        return (self.num_output_tokens - 1) / seconds if seconds > 0 else None
