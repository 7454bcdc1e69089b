"""RequestOutput and CompletionOutput: what the engine reports about a request after a step.

Shaped as vLLM's (``vllm/outputs.py``): a ``RequestOutput`` holds the prompt and ``outputs``, one
``CompletionOutput`` per completion (``SamplingParams(n=...)``). Hetero's own fields stay: ``text``,
``output_token_ids``, ``logprobs`` and ``finish_reason`` are those of the first completion (the same
objects), so code written for one completion per request keeps working.

``finish_reason`` differs in one word: the request's says ``eos`` where vLLM's (and a
``CompletionOutput``'s) says ``stop`` with ``stop_reason`` None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hetero_core.engine.requests.metrics import RequestMetrics
from hetero_core.engine.requests.sequence import Sequence


@dataclass(frozen=True)
class CompletionOutput:
    """One completion of a request (vLLM's ``CompletionOutput``)."""

    index: int  # its place among the request's completions
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None  # sum of the sampled tokens' logprobs (None without logprobs)
    logprobs: list | None  # with SamplingParams(logprobs=N): one TokenLogprobs per token
    finish_reason: str | None  # "stop" (EOS, a stop id or string), "length", "abort"; None while running
    stop_reason: int | str | None = None  # the stop token id or string that ended it (None for EOS)

    def finished(self) -> bool:
        return self.finish_reason is not None


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
    outputs: list[CompletionOutput] = field(default_factory=list)  # one per completion (n)
    prompt_logprobs: list | None = None  # SamplingParams.prompt_logprobs: None, then a dict per prompt token
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served (summed over completions)
    kv_blocks: Any = None  # the prompt's KVBlocks, for a request added with export_kv (kv_transfer.py)

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def metrics(self) -> RequestMetrics:
        """Timings: arrival, first token, finish; time to first token, latency, decode speed."""
        return RequestMetrics(
            self.arrival_time,
            self.first_token_time,
            self.finish_time,
            len(self.prompt_token_ids),
            len(self.output_token_ids),
        )

    @classmethod
    def from_sequence(cls, seq: Sequence, index: int = 0) -> RequestOutput:
        token_ids = list(seq.output_token_ids)
        logprobs = list(seq.output_logprobs) if seq.params.logprobs is not None else None
        reason = seq.finish_reason.value if seq.finish_reason else None
        completion = CompletionOutput(
            index=index,
            text=seq.output_text,
            token_ids=token_ids,
            cumulative_logprob=sum(lp.logprob for lp in logprobs if lp is not None)
            if logprobs is not None
            else None,
            logprobs=logprobs,
            finish_reason=completion_finish_reason(reason),
            stop_reason=seq.stop_reason,
        )
        return cls(
            request_id=seq.request_id,
            prompt=seq.prompt,
            prompt_token_ids=list(seq.prompt_token_ids),
            output_token_ids=token_ids,
            text=seq.output_text,
            finished=seq.status.is_done,
            finish_reason=reason,
            error=seq.error,
            logprobs=logprobs,
            num_preemptions=seq.num_preemptions,
            arrival_time=seq.arrival_time,
            first_token_time=seq.first_token_time,
            finish_time=seq.finish_time,
            outputs=[completion],
            num_cached_tokens=seq.num_cached_tokens,
            prompt_logprobs=(seq.prompt_logprobs or [None])
            if seq.params.prompt_logprobs is not None
            else None,
            kv_blocks=seq.kv_export,
        )


def completion_finish_reason(reason: str | None) -> str | None:
    """The engine's finish reason in vLLM's words: EOS is a "stop"."""
    return "stop" if reason == "eos" else reason
