"""EngineState: everything the engine's parts share, declared in one place.

``Engine`` builds one and hands it to its parts: ``RequestIntake`` (requests in), ``StepDriver``
(a scheduled step run), ``StepSampler`` (a step's tokens) and ``Postprocessor`` (tokens appended,
stops, requests finished). What a single part keeps to itself (the async step in flight, the
sampler) is that part's own attribute, not here. The fields are slots: a part cannot add state
nobody declared.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hetero_core.engine.requests.detokenizer import IncrementalDetokenizer
from hetero_core.engine.requests.outputs import RequestOutput
from hetero_core.engine.requests.parallel_sampling import ParallelRequests
from hetero_core.engine.requests.processor import RequestProcessor
from hetero_core.engine.requests.sequence import Sequence
from hetero_core.engine.sampling.structured_output import StructuredOutput
from hetero_core.engine.scheduling.scheduler import Scheduler
from hetero_core.engine.speculation.speculation import Speculation
from hetero_core.engine.step_timings import StepTimings
from hetero_core.engine.token_texts import TokenTexts

__all__ = ["EngineState"]


@dataclass(eq=False, slots=True)
class EngineState:
    processor: RequestProcessor  # checks and tokenizes requests; its tokenizer is the engine's
    executor: Any  # runs a step's batch (the executor protocol); callers may wrap or replace it
    scheduler: Scheduler  # the queues, the KV blocks and each step's batch
    structured_output: StructuredOutput | None = None  # grammar states, bitmasks (None: no guided decoding)
    speculation: Speculation | None = None  # proposals and their counters (None: no speculative decoding)
    seqs: dict[str, Sequence] = field(default_factory=dict)  # request id -> it, until step() returns its end
    detokenizers: dict[int, IncrementalDetokenizer] = field(default_factory=dict)  # seq id -> it, if queued
    seq_ids: Iterator[int] = field(default_factory=itertools.count)  # the next sequence number
    finished_outputs: list[RequestOutput] = field(default_factory=list)  # final outputs for the next step()
    held_outputs: dict[str, RequestOutput] = field(default_factory=dict)  # others' outputs generate() saw
    parallel: ParallelRequests = field(default_factory=ParallelRequests)  # requests of n > 1 completions
    token_texts: TokenTexts = field(default_factory=TokenTexts)  # each single token's text, per tokenizer
    num_queued_tokens: int = 0  # prompt + output tokens still to come of queued requests
    num_constrained: int = 0  # queued requests with a structured-output grammar
    timings: StepTimings = field(default_factory=StepTimings)  # time per phase of a step, and steps run

    @property
    def tokenizer(self):
        return self.processor.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.processor.max_model_len
