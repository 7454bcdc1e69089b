"""One request as AsyncLLM streams it: the deltas it hands out and the bookkeeping behind them."""

from __future__ import annotations

from dataclasses import dataclass, field

from hetero_core.engine.requests.outputs import RequestOutput
from hetero_core.engine.requests.processor import EngineRequest


@dataclass(frozen=True)
class TokenLogprob:
    """The logprob of one generated token and its top alternatives, tokens as text."""

    token_id: int
    token: str
    logprob: float | None  # None when the executor returns token ids without logits
    top: list[tuple[str, float]] = field(default_factory=list)


@dataclass(frozen=True)
class RequestDelta:
    """What one request gained since its previous delta; ``output`` is its state so far."""

    output: RequestOutput
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None  # one per new token when the request asked for logprobs

    @property
    def finished(self) -> bool:
        return self.output.finished


class RequestStream:
    """One request from its slot to its end: where its deltas go and what it has been sent.

    Made in the caller's thread when the request takes its slot; ``start`` gives it the tokenized
    request; from then on the engine loop thread sends to it. ``abort_requested`` is set by
    ``AsyncLLM.abort`` from any thread (the loop aborts the request as soon as it adds it).
    """

    def __init__(self, request_id: str, loop, sink) -> None:
        self.request_id, self.loop, self.sink = request_id, loop, sink
        self.request: EngineRequest | None = None
        self.abort_requested = False
        self.num_sent_chars = self.num_sent_tokens = 0
        self.hold_chars = 0

    def start(self, request: EngineRequest) -> None:
        self.request = request
        self.hold_chars = max((len(s) for s in request.params.stop), default=1) - 1

    def delta(self, out: RequestOutput, tokenizer) -> RequestDelta:
        # Hold back a possible stop-string prefix: the engine truncates the text once it matches.
        end = len(out.text) if out.finished else max(self.num_sent_chars, len(out.text) - self.hold_chars)
        text, self.num_sent_chars = out.text[self.num_sent_chars : end], end
        new_ids = out.output_token_ids[self.num_sent_tokens :]
        logprobs = None
        if out.logprobs is not None:
            logprobs = token_logprobs(tokenizer, new_ids, out.logprobs[self.num_sent_tokens :])
        self.num_sent_tokens = len(out.output_token_ids)
        return RequestDelta(out, text, new_ids, logprobs)

    def send(self, item) -> bool:
        try:
            self.loop.call_soon_threadsafe(self.sink.put_nowait, item)
            return True
        except RuntimeError:  # the caller's event loop is closed: nobody is listening
            return False


def token_logprobs(tokenizer, token_ids: list[int], logprobs: list) -> list[TokenLogprob]:
    """The engine's per-token logprobs (``TokenLogprobs`` or None) with their tokens as text."""
    return [_token_logprob(tokenizer, t, lp) for t, lp in zip(token_ids, logprobs)]


def _token_logprob(tokenizer, token_id: int, lp) -> TokenLogprob:
    if lp is None:
        return TokenLogprob(token_id, tokenizer.decode([token_id]), None)
    top = [(tokenizer.decode([t]), v) for t, v in lp.top]
    return TokenLogprob(token_id, tokenizer.decode([token_id]), lp.logprob, top)
