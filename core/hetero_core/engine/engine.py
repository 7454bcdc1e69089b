"""Engine: requests in, tokens out. ``step()`` is schedule, execute, postprocess.

Bookkeeping guarantees (tested by a hypothesis state machine, tests/test_engine_state_machine.py):
- every request that ``add_request`` accepted ends with exactly one final output: finished
  (length, eos, stop), aborted, or failed with a reason in ``RequestOutput.error``;
- ``add_request`` raises ``InvalidRequestError`` for what can never run (bad prompt or parameters,
  longer than ``max_model_len``, more KV blocks than the pool has) and then keeps nothing;
  ``generate`` / ``add_requests`` check every request before queueing any, so an error leaves no
  orphan behind;
- a request that fails (non-finite logits, an executor error) fails alone, or with the batch it ran
  in (or, swapped out by that step, whose K/V it lost); the next step runs normally;
- no exception from the executor, the sampler or the tokenizer escapes ``step()``, except
  ``ExecutorDeadError``: an executor that can no longer run anything (a tensor-parallel worker died);
- a finished request leaves nothing behind: request table, detokenizer and KV blocks are freed.

Outputs: ``step()`` returns every request's final output once, and after every step that advanced
it, the output of a request added with ``stream=True`` (the default of ``add_request``);
``generate``, ``LLM`` and the CLI's batch paths add theirs with ``stream=False`` and get final
outputs only, so no per-step ``RequestOutput`` is built for requests nobody reads until the end.

Async scheduling (``async_scheduling=True``): the executor runs on its own thread
(``executor_thread``) and ``step()`` schedules step N+1 while it runs step N, planning as if step N's
sequences each got their token (``num_pending_tokens``); it then waits for step N, writes its
sampled tokens into step N+1's batch, starts step N+1 and postprocesses step N (stop checks that
end a request discard its token from step N+1). Outputs are the same tokens as without it (the
executor runs the same positions of the same requests); ``step()`` returns step N's outputs, one
call later, and ``has_unfinished_requests()`` counts the step still running.

The engine is single-threaded: a second thread that calls in while another is inside gets
``ConcurrentEngineUseError`` (``thread_guard``) and changes nothing. ``LLM`` (generate and chat from
several threads) and ``AsyncLLM`` (one loop thread) share an engine between threads. Checking and
tokenizing a request (``engine.processor``) touches no engine state and is safe from any thread.

The parts: ``Engine`` holds the state (set up in ``__init__``) and ``step()``; requests come in
through ``request_intake`` (add, check, queue, abort), a scheduled step runs through
``step_driver`` (sync, or async on the executor thread) and ends in ``postprocess`` (sampling, stop
checks, finishing requests). Those three are mixins of ``Engine`` over the one state.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from time import perf_counter

from hetero_core.engine.detokenizer import IncrementalDetokenizer
from hetero_core.engine.executor_thread import ExecutorThread
from hetero_core.engine.outputs import RequestOutput
from hetero_core.engine.parallel_sampling import ParallelRequests
from hetero_core.engine.params import SamplingParams
from hetero_core.engine.postprocess import Postprocess
from hetero_core.engine.processor import RequestProcessor
from hetero_core.engine.prompt_logprobs import prompt_logprobs_refusal
from hetero_core.engine.prompts import Prompt
from hetero_core.engine.request_intake import Params, RequestIntake
from hetero_core.engine.scheduled_step import ScheduledStep
from hetero_core.engine.scheduler import Scheduler
from hetero_core.engine.scheduler_stats import SchedulerStats
from hetero_core.engine.sequence import Sequence
from hetero_core.engine.step_driver import StepDriver
from hetero_core.engine.step_timings import StepTimings
from hetero_core.engine.thread_guard import ThreadGuard

__all__ = ["Engine", "Prompt"]


class Engine(RequestIntake, StepDriver, Postprocess):
    """Requests in (``request_intake``), steps run (``step_driver``), tokens out (``postprocess``)."""

    def __init__(self, *, tokenizer, executor, scheduler: Scheduler, max_model_len: int,
                 default_params: SamplingParams | None = None, sampler_seed: int | None = None,
                 structured_output=None, async_scheduling: bool = False, speculation=None) -> None:
        """``structured_output``: an ``engine.structured_output.StructuredOutput`` (guided decoding), or
        None; ``async_scheduling``: plan the next step while the executor runs this one;
        ``speculation``: an ``engine.speculation.Speculation`` (speculative decoding, sync steps only), or None."""
        if speculation is not None and async_scheduling:
            raise ValueError("speculative decoding runs without async scheduling; pass async_scheduling=False")
        self.processor = RequestProcessor(tokenizer, max_model_len, default_params or SamplingParams(),
                                          structured_output)
        self.processor.prompt_logprobs_refusal = prompt_logprobs_refusal(executor)
        self.structured_output = structured_output
        self.executor = executor
        self.scheduler = scheduler
        self._sampler_seed = sampler_seed
        self._sampler = None  # created on first logits output (imports torch)
        self._seqs: dict[str, Sequence] = {}
        self._detokenizers: dict[int, IncrementalDetokenizer] = {}
        self._seq_counter = itertools.count()
        self._finished_outputs: list[RequestOutput] = []
        self._held_outputs: dict[str, RequestOutput] = {}  # other callers' outputs seen by generate()
        self._parallel = ParallelRequests()  # requests of n > 1 completions (parallel_sampling)
        self.guard = ThreadGuard("an Engine")
        self.num_steps = 0
        self._num_queued_tokens = 0  # prompt + output tokens still to come of queued requests
        self._num_constrained = 0  # queued requests with a structured-output grammar
        self.async_scheduling = async_scheduling
        self.speculation = speculation
        self._executor_thread: ExecutorThread | None = None  # started at the first async step
        self._running: tuple[ScheduledStep, object, object] | None = None  # async: the step on the thread, its future, its bitmask
        self.timings = StepTimings()
        self._texts_of, self._texts = None, {}  # _token_texts()

    @property
    def tokenizer(self):
        return self.processor.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.processor.max_model_len

    @property
    def default_params(self) -> SamplingParams:
        return self.processor.default_params

    def has_unfinished_requests(self) -> bool:
        """Whether requests are queued or running, a step is still running (async scheduling), or
        completions of n > 1 are yet to start or merge."""
        return self.scheduler.has_work or self._running is not None or bool(self._parallel)

    def has_request(self, request_id: str) -> bool:
        """Whether the engine holds the request: queued, running, or ended with its final output
        not yet returned by ``step()``."""
        return request_id in self._seqs or request_id in self._held_outputs or request_id in self._parallel

    def hold_outputs(self, outputs: Iterable[RequestOutput]) -> None:
        """Keep outputs for the next ``step()`` caller (the latest per request): how ``generate()``
        and ``LLM`` pass on outputs of requests they did not add."""
        with self.guard:
            for out in outputs:
                self._held_outputs[out.request_id] = out

    # -- the loop ---------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one step; return the final outputs of requests that ended since the last step and
        the outputs of streamed requests that progressed (including those another caller's
        ``generate()`` ran but did not own). With async scheduling, the step whose outputs come
        back is the one scheduled by the call before."""
        with self.guard:
            for seq, detokenizer in self._parallel.to_queue():
                self._queue(seq, detokenizer)
            timings, was_running = self.timings, self._running is not None
            started = perf_counter()
            if self.speculation is not None:
                self.speculation.propose(self.scheduler.running)
            scheduled = self.scheduler.schedule()
            if self.speculation is not None:
                for seq in scheduled.preempted:
                    self.speculation.release(seq)
            build_seconds = self.scheduler.batches.take_seconds()
            timings.build_batch_s += build_seconds
            timings.schedule_s += perf_counter() - started - build_seconds
            if self.async_scheduling:
                progressed = self._step_async(scheduled)
            else:
                progressed = self._step_sync(scheduled)
            if scheduled.is_stalled and not was_running and self._running is None:
                self._fail_unschedulable()  # requests wait and nothing will ever change: fail them
            started = perf_counter()
            outputs = self._outputs(progressed)
            timings.outputs_s += perf_counter() - started
            return outputs

    def _outputs(self, progressed: list[Sequence]) -> list[RequestOutput]:
        outputs, self._finished_outputs = self._finished_outputs, []
        for out in outputs:  # reported once; the engine forgets finished requests
            self._seqs.pop(out.request_id, None)
        outputs += [RequestOutput.from_sequence(s) for s in progressed if s.stream and not s.status.is_done]
        outputs = self._parallel.merge(outputs)
        if self._held_outputs:
            held, self._held_outputs = self._held_outputs, {}
            fresh = {o.request_id for o in outputs}
            outputs = [o for rid, o in held.items() if rid not in fresh] + outputs
        return outputs

    def generate(self, prompts: Iterable[Prompt] | Prompt, params: Params | list[Params] = None, *,
                 priority: int = 0, tenant: str | None = None) -> list[RequestOutput]:
        """Run prompts to completion; outputs in prompt order. ``prompts``: one prompt (a string,
        token ids, a vLLM prompt dict) or a list. Every request is checked before any is queued
        (``add_requests``); a bad prompt fails alone (its output carries the error). Outputs of
        requests added with ``add_request`` are kept for the next ``step()`` caller."""
        with self.guard:
            ids = self.add_requests(prompts, params, priority=priority, tenant=tenant, stream=False)
            own, finished = set(ids), {}
            while len(finished) < len(ids):
                if not (self.has_unfinished_requests() or self._finished_outputs):
                    missing = sorted(own - set(finished))
                    raise RuntimeError(f"engine bug: requests {missing} ended without a final output")
                outputs = self.step()
                self.hold_outputs(out for out in outputs if out.request_id not in own)
                finished.update((out.request_id, out) for out in outputs if out.request_id in own and out.finished)
            return [finished[i] for i in ids]

    def stats(self) -> SchedulerStats:
        """Counters since the start (steps, preemptions by mode, prefix-cache hit / queried tokens) and
        the state after the last step (queues, free blocks, its batch, queued tokens). Cheap: every
        field is a counter kept up to date."""
        stats = self.scheduler.stats(num_queued_tokens=self._num_queued_tokens)
        if self.speculation is None:
            return stats
        spec = self.speculation
        return dataclasses.replace(stats, spec_num_drafts=spec.num_drafts, spec_num_draft_tokens=spec.num_draft_tokens,
                                   spec_num_accepted_tokens=spec.num_accepted_tokens)

    def running_request_ids(self) -> list[str]:
        """The requests that are running (holding KV blocks) now."""
        return [seq.request_id for seq in self.scheduler.running]

    def shutdown(self) -> None:
        """Wait for a step still running (its outputs are dropped), then release the executor."""
        with self.guard:
            if self._executor_thread is not None:
                self._executor_thread.shutdown()
                self._executor_thread = self._running = None
            if self.speculation is not None:
                self.speculation.shutdown()
            self.executor.shutdown()

