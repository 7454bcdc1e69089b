"""Engine: requests in, tokens out. ``step()`` is schedule, execute, postprocess.

Bookkeeping guarantees (tested by a hypothesis state machine, tests/engine/test_engine_state_machine.py):
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

The parts, each over the one ``EngineState`` (``state``: the request table, detokenizers, counters,
the executor and scheduler): ``RequestIntake`` (``request_intake``: add, check, queue, abort),
``StepDriver`` (``step_driver``: a scheduled step run, in sync or on the executor thread),
``StepSampler`` (``step_sampler``: the executor's output to tokens) and ``Postprocessor``
(``postprocess``: tokens appended, stop checks, requests finished). ``Engine`` builds them and
``step()`` reads schedule -> run -> outputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from time import perf_counter

from hetero_core.engine.kv.kv_transfer import KVHandoff
from hetero_core.engine.postprocess import Postprocessor
from hetero_core.engine.request_intake import Params, RequestIntake
from hetero_core.engine.requests.outputs import RequestOutput
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.engine.requests.processor import EngineRequest, RequestProcessor
from hetero_core.engine.requests.prompts import Prompt
from hetero_core.engine.requests.sequence import Sequence
from hetero_core.engine.sampling.prompt_logprobs import prompt_logprobs_refusal
from hetero_core.engine.scheduling.scheduled_step import ScheduledStep
from hetero_core.engine.scheduling.scheduler import Scheduler
from hetero_core.engine.scheduling.scheduler_stats import SchedulerStats
from hetero_core.engine.state import EngineState
from hetero_core.engine.step_driver import StepDriver
from hetero_core.engine.step_sampler import StepSampler
from hetero_core.engine.step_timings import StepTimings
from hetero_core.engine.thread_guard import ThreadGuard

__all__ = ["Engine", "Prompt"]


class Engine:
    """Requests in (``intake``), steps run (``driver``), tokens out (``postprocessor``), over ``state``."""

    def __init__(
        self,
        *,
        tokenizer,
        executor,
        scheduler: Scheduler,
        max_model_len: int,
        default_params: SamplingParams | None = None,
        sampler_seed: int | None = None,
        structured_output=None,
        async_scheduling: bool = False,
        speculation=None,
        pipelined_steps: bool = False,
    ) -> None:
        """``structured_output``: an ``engine.structured_output.StructuredOutput`` (guided decoding), or
        None; ``async_scheduling``: plan the next step while the executor runs this one;
        ``speculation``: an ``engine.speculation.Speculation`` (speculative decoding, sync steps only),
        or None; ``pipelined_steps``: keep two steps of disjoint sequences in flight on an executor
        that declares ``pipelined_steps`` (pipeline stages), instead of async or sync steps."""
        if speculation is not None and (async_scheduling or pipelined_steps):
            raise ValueError(
                "speculative decoding runs without async scheduling; pass async_scheduling=False"
            )
        processor = RequestProcessor(
            tokenizer, max_model_len, default_params or SamplingParams(), structured_output
        )
        processor.prompt_logprobs_refusal = prompt_logprobs_refusal(executor)
        self.state = EngineState(processor, executor, scheduler, structured_output, speculation)
        self.guard = ThreadGuard("an Engine")
        self.async_scheduling = async_scheduling and not pipelined_steps
        self.pipelined_steps = pipelined_steps
        scheduler.skip_pending = pipelined_steps  # the steps in flight hold disjoint sequences
        self.postprocessor = Postprocessor(self.state)
        self.intake = RequestIntake(self.state, self.postprocessor)
        self.driver = StepDriver(self.state, StepSampler(self.state, sampler_seed), self.postprocessor)

    @property
    def executor(self):
        """Runs the steps; callers (tests, benchmarks) may wrap or replace it."""
        return self.state.executor

    @executor.setter
    def executor(self, executor) -> None:
        self.state.executor = executor

    @property
    def processor(self) -> RequestProcessor:
        """Checks and tokenizes requests; safe from any thread."""
        return self.state.processor

    @property
    def scheduler(self) -> Scheduler:
        return self.state.scheduler

    @property
    def structured_output(self):
        return self.state.structured_output

    @property
    def speculation(self):
        return self.state.speculation

    @property
    def timings(self) -> StepTimings:
        return self.state.timings

    @property
    def num_steps(self) -> int:
        """Steps that ran a batch."""
        return self.state.timings.num_steps

    @property
    def tokenizer(self):
        return self.state.processor.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.state.processor.max_model_len

    @property
    def default_params(self) -> SamplingParams:
        return self.state.processor.default_params

    # -- requests in (request_intake) -------------------------------------------------------------
    def add_request(
        self,
        prompt: Prompt | EngineRequest,
        params: Params = None,
        request_id: str | None = None,
        *,
        priority: int = 0,
        tenant: str | None = None,
        stream: bool = True,
        kv_transfer: KVHandoff | None = None,
        export_kv: bool = False,
    ) -> str:
        """Queue a request and return its id. ``params``: SamplingParams, a dict of their fields
        (overriding the engine's defaults) or None (the defaults). Raises InvalidRequestError, and
        keeps nothing, for a request that is invalid or can never run within the engine's limits.
        ``priority`` (lower first) and ``tenant`` are read by the scheduler policy. ``prompt`` may
        be an ``EngineRequest`` from ``engine.processor`` (tokenized already, with its own params,
        priority and tenant): then adding it does no work that grows with the prompt. ``stream``:
        step() returns the request's output after every step that advances it (False: only its
        final output).

        Prefill/decode disaggregation (``kv_transfer.py``): ``export_kv`` makes the final output carry
        the prompt's KV blocks (``RequestOutput.kv_blocks``); ``kv_transfer`` (a ``KVHandoff``: the
        prompt's blocks and first token from a prefill engine) continues a request another engine
        prefilled: the prompt is not computed again."""
        with self.guard:
            return self.intake.add_request(
                prompt,
                params,
                request_id,
                priority=priority,
                tenant=tenant,
                stream=stream,
                kv_transfer=kv_transfer,
                export_kv=export_kv,
            )

    def add_requests(
        self,
        prompts: Iterable[Prompt] | Prompt,
        params: Params | list[Params] = None,
        *,
        priority: int = 0,
        tenant: str | None = None,
        stream: bool = True,
    ) -> list[str]:
        """Check every request, then queue them all; return their ids in order. A request that can
        never run is queued as failed (its final output, with the error, comes from the next
        ``step()``); anything else that goes wrong raises before any request is queued. ``stream``:
        as for ``add_request``."""
        with self.guard:
            return self.intake.add_requests(prompts, params, priority=priority, tenant=tenant, stream=stream)

    def abort(self, request_id: str) -> bool:
        """Stop a request; its blocks are freed at once. False if unknown or already done."""
        with self.guard:
            return self.intake.abort(request_id)

    def has_unfinished_requests(self) -> bool:
        """Whether requests are queued or running, a step is still running (async scheduling), or
        completions of n > 1 are yet to start or merge."""
        return self.state.scheduler.has_work or self.driver.is_running or bool(self.state.parallel)

    def has_request(self, request_id: str) -> bool:
        """Whether the engine holds the request: queued, running, or ended with its final output
        not yet returned by ``step()``."""
        state = self.state
        return request_id in state.seqs or request_id in state.held_outputs or request_id in state.parallel

    def hold_outputs(self, outputs: Iterable[RequestOutput]) -> None:
        """Keep outputs for the next ``step()`` caller (the latest per request): how ``generate()``
        and ``LLM`` pass on outputs of requests they did not add."""
        with self.guard:
            for out in outputs:
                self.state.held_outputs[out.request_id] = out

    # -- the loop ---------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one step; return the final outputs of requests that ended since the last step and
        the outputs of streamed requests that progressed (including those another caller's
        ``generate()`` ran but did not own). With async scheduling, the step whose outputs come
        back is the one scheduled by the call before."""
        with self.guard:
            was_running = self.driver.is_running
            scheduled = self._schedule()
            if self.pipelined_steps:  # start it; finish the oldest step once two are in flight
                progressed = self.driver.run_pipelined(scheduled)
            elif self.async_scheduling:  # on the executor thread; sample and postprocess the step before
                progressed = self.driver.run_async(scheduled)
            else:  # run it, sample and postprocess it
                progressed = self.driver.run_sync(scheduled)
            if scheduled.is_stalled and not was_running and not self.driver.is_running:
                self.postprocessor.fail_unschedulable()  # requests wait and nothing will ever change
            started = perf_counter()
            outputs = self._outputs(progressed)
            self.state.timings.outputs_s += perf_counter() - started
            return outputs

    def _schedule(self) -> ScheduledStep:
        """The next step: waiting completions of n > 1 queued, proposals asked, the scheduler run."""
        state = self.state
        for seq, detokenizer in state.parallel.to_queue():
            self.intake.queue(seq, detokenizer)
        started = perf_counter()
        if state.speculation is not None:
            state.speculation.propose(state.scheduler.running)
        scheduled = state.scheduler.schedule()
        if state.speculation is not None:
            for seq in scheduled.preempted:
                state.speculation.release(seq)
        build_seconds = state.scheduler.batches.take_seconds()
        state.timings.build_batch_s += build_seconds
        state.timings.schedule_s += perf_counter() - started - build_seconds
        return scheduled

    def _outputs(self, progressed: list[Sequence]) -> list[RequestOutput]:
        state = self.state
        outputs, state.finished_outputs = state.finished_outputs, []
        for out in outputs:  # reported once; the engine forgets finished requests
            state.seqs.pop(out.request_id, None)
        outputs += [RequestOutput.from_sequence(s) for s in progressed if s.stream and not s.status.is_done]
        outputs = state.parallel.merge(outputs)
        if state.held_outputs:
            held, state.held_outputs = state.held_outputs, {}
            fresh = {o.request_id for o in outputs}
            outputs = [o for rid, o in held.items() if rid not in fresh] + outputs
        return outputs

    def generate(
        self,
        prompts: Iterable[Prompt] | Prompt,
        params: Params | list[Params] = None,
        *,
        priority: int = 0,
        tenant: str | None = None,
    ) -> list[RequestOutput]:
        """Run prompts to completion; outputs in prompt order. ``prompts``: one prompt (a string,
        token ids, a vLLM prompt dict) or a list. Every request is checked before any is queued
        (``add_requests``); a bad prompt fails alone (its output carries the error). Outputs of
        requests added with ``add_request`` are kept for the next ``step()`` caller."""
        with self.guard:
            ids = self.add_requests(prompts, params, priority=priority, tenant=tenant, stream=False)
            own, finished = set(ids), {}
            while len(finished) < len(ids):
                if not (self.has_unfinished_requests() or self.state.finished_outputs):
                    missing = sorted(own - set(finished))
                    raise RuntimeError(f"engine bug: requests {missing} ended without a final output")
                outputs = self.step()
                self.hold_outputs(out for out in outputs if out.request_id not in own)
                finished.update((o.request_id, o) for o in outputs if o.request_id in own and o.finished)
            return [finished[i] for i in ids]

    def stats(self) -> SchedulerStats:
        """Counters since the start (steps, preemptions by mode, prefix-cache hit / queried tokens) and
        the state after the last step (queues, free blocks, its batch, queued tokens). Cheap: every
        field is a counter kept up to date."""
        stats = self.state.scheduler.stats(num_queued_tokens=self.state.num_queued_tokens)
        spec = self.state.speculation
        if spec is None:
            return stats
        return dataclasses.replace(
            stats,
            spec_num_drafts=spec.num_drafts,
            spec_num_draft_tokens=spec.num_draft_tokens,
            spec_num_accepted_tokens=spec.num_accepted_tokens,
        )

    def running_request_ids(self) -> list[str]:
        """The requests that are running (holding KV blocks) now."""
        return [seq.request_id for seq in self.state.scheduler.running]

    def shutdown(self) -> None:
        """Wait for a step still running (its outputs are dropped), then release the executor."""
        with self.guard:
            self.driver.shutdown()
            if self.state.speculation is not None:
                self.state.speculation.shutdown()
            self.state.executor.shutdown()
