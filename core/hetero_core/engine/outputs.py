"""RequestOutput: what the engine reports about a request after a step."""

from __future__ import annotations

from dataclasses import dataclass

from hetero_core.engine.metrics import RequestMetrics
from hetero_core.engine.sequence import Sequence


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None  # length | eos | stop | abort (None while running or failed)
    error: str | None  # set when the request failed
    logprobs: list | None
    num_preemptions: int
    arrival_time: float
    first_token_time: float | None
    finish_time: float | None

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def metrics(self) -> RequestMetrics:
        """Timings: arrival, first token, finish; time to first token, latency, decode speed."""
        return RequestMetrics(self.arrival_time, self.first_token_time, self.finish_time,
                              len(self.prompt_token_ids), len(self.output_token_ids))

    @classmethod
    def from_sequence(cls, seq: Sequence) -> RequestOutput:
        return cls(
            request_id=seq.request_id,
            prompt=seq.prompt,
            prompt_token_ids=list(seq.prompt_token_ids),
            output_token_ids=list(seq.output_token_ids),
            text=seq.output_text,
            finished=seq.status.is_done,
            finish_reason=seq.finish_reason.value if seq.finish_reason else None,
            error=seq.error,
            logprobs=list(seq.output_logprobs) if seq.params.logprobs is not None else None,
            num_preemptions=seq.num_preemptions,
            arrival_time=seq.arrival_time,
            first_token_time=seq.first_token_time,
            finish_time=seq.finish_time,
        )
