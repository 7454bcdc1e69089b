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
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Iterable
from dataclasses import replace
from time import perf_counter

from hetero_core.engine.detokenizer import IncrementalDetokenizer
from hetero_core.engine.outputs import RequestOutput
from hetero_core.engine.parallel_sampling import ParallelRequest, ParallelRequests, child_params, child_request_id
from hetero_core.engine.params import SamplingParams
from hetero_core.engine.processor import EngineRequest, RequestProcessor
from hetero_core.engine.prompts import Prompt, as_prompt_list, prompt_text
from hetero_core.engine.thread_guard import ThreadGuard
from hetero_core.engine.block_transfer import apply_block_transfers
from hetero_core.engine.executor_thread import ExecutorThread
from hetero_core.engine.scheduled_step import ScheduledStep, confirm_swap_ins, unschedule, without_seqs
from hetero_core.engine.scheduler import Scheduler
from hetero_core.engine.scheduler_stats import SchedulerStats
from hetero_core.engine.sequence import FinishReason, Sequence, SequenceStatus
from hetero_core.engine.step_timings import StepTimings
from hetero_core.engine.stop_checker import check_stop_string, check_stop_token
from hetero_core.errors import ExecutorDeadError, InvalidRequestError
from hetero_core.logging import get_logger

log = get_logger("hetero.engine")
Params = SamplingParams | dict | None
Sampled = list[tuple[int, object, str | None]]  # (token id, logprobs, error) per sampled row

__all__ = ["Engine", "Prompt"]


class Engine:
    def __init__(self, *, tokenizer, executor, scheduler: Scheduler, max_model_len: int,
                 default_params: SamplingParams | None = None, sampler_seed: int | None = None,
                 structured_output=None, async_scheduling: bool = False) -> None:
        """``structured_output``: an ``engine.structured_output.StructuredOutput`` (guided decoding), or
        None; ``async_scheduling``: plan the next step while the executor runs this one."""
        self.processor = RequestProcessor(tokenizer, max_model_len, default_params or SamplingParams(),
                                          structured_output)
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

    # -- requests ---------------------------------------------------------------------------------
    def add_request(self, prompt: Prompt | EngineRequest, params: Params = None, request_id: str | None = None, *,
                    priority: int = 0, tenant: str | None = None, stream: bool = True) -> str:
        """Queue a request and return its id. ``params``: SamplingParams, a dict of their fields
        (overriding the engine's defaults) or None (the defaults). Raises InvalidRequestError, and
        keeps nothing, for a request that is invalid or can never run within the engine's limits.
        ``priority`` (lower first) and ``tenant`` are read by the scheduler policy. ``prompt`` may
        be an ``EngineRequest`` from ``engine.processor`` (tokenized already, with its own params,
        priority and tenant): then adding it does no work that grows with the prompt. ``stream``:
        step() returns the request's output after every step that advances it (False: only its
        final output)."""
        with self.guard:
            if request_id is not None and not isinstance(request_id, str):
                raise InvalidRequestError(f"request_id must be a string, got {type(request_id).__name__}")
            if isinstance(prompt, EngineRequest):
                if params is not None or priority != 0 or tenant is not None:
                    raise InvalidRequestError("an EngineRequest carries its own params, priority and tenant")
                request = prompt
            else:
                request = self.processor.process(prompt, params, priority=priority, tenant=tenant)
            return self._queue_entry(self._new_entry(request, request_id), stream)

    def add_requests(self, prompts: Iterable[Prompt] | Prompt, params: Params | list[Params] = None, *,
                     priority: int = 0, tenant: str | None = None, stream: bool = True) -> list[str]:
        """Check every request, then queue them all; return their ids in order. A request that can
        never run is queued as failed (its final output, with the error, comes from the next
        ``step()``); anything else that goes wrong raises before any request is queued. ``stream``:
        as for ``add_request``."""
        with self.guard:
            prompts = as_prompt_list(prompts)
            params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
            if len(params_list) != len(prompts):
                raise InvalidRequestError(f"got {len(params_list)} sampling params for {len(prompts)} prompts")
            checked: list[tuple[Sequence, IncrementalDetokenizer] | ParallelRequest | str] = []
            for prompt, p in zip(prompts, params_list):
                try:
                    request = self.processor.process(prompt, p, priority=priority, tenant=tenant)
                    checked.append(self._new_entry(request, None))
                except InvalidRequestError as exc:
                    checked.append(str(exc))
            ids = []
            for prompt, item in zip(prompts, checked):
                if isinstance(item, str):
                    ids.append(self._reject(prompt, item))
                else:
                    ids.append(self._queue_entry(item, stream))
            return ids

    def abort(self, request_id: str) -> bool:
        """Stop a request; its blocks are freed at once. False if unknown or already done."""
        with self.guard:
            if request_id in self._parallel:
                return self._abort_parallel(request_id)
            seq = self._seqs.get(request_id) if isinstance(request_id, str) else None
            if seq is None or seq.status.is_done:
                return False
            self._finish(seq, reason=FinishReason.ABORT)
            return True

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
            scheduled = self.scheduler.schedule()
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

    def _step_sync(self, scheduled: ScheduledStep) -> list[Sequence]:
        """Run the step and postprocess it; the sequences it ran."""
        if scheduled.batch is None and not scheduled.has_transfers:
            return []
        started = perf_counter()
        try:
            apply_block_transfers(self.executor, scheduled)
            batch = self._constrained(scheduled) if scheduled.batch is not None else None
            output = self.executor.execute(batch) if batch is not None else None
        except ExecutorDeadError:  # nothing can run any more (e.g. a tensor-parallel worker died)
            raise
        except Exception as exc:  # a failing executor fails this batch's requests, not the engine
            self.timings.execute_s += perf_counter() - started
            self._fail_step(scheduled, exc, executor_failed=True)
            return []
        except BaseException:  # KeyboardInterrupt: the step did not happen; stepping again redoes it
            unschedule(scheduled)
            raise
        self.timings.execute_s += perf_counter() - started
        return self._complete(scheduled, output, batch.token_bitmask if batch is not None else None)

    def _step_async(self, scheduled: ScheduledStep) -> list[Sequence]:
        """Finish the running step, start ``scheduled``, postprocess the finished one; the
        sequences it ran."""
        previous, self._running = self._running, None
        sampled = None
        if previous is not None:
            step, future, bitmask = previous
            started = perf_counter()
            try:
                output = future.result()
            except ExecutorDeadError:
                raise
            except Exception as exc:  # fails this step's requests below, not the engine
                output = exc
            self.timings.execute_s += perf_counter() - started
            if step.batch is None and not isinstance(output, Exception):  # block transfers only, done
                previous = None
            else:
                sampled = output if isinstance(output, Exception) else self._sample(step, output, bitmask)
                if isinstance(sampled, Exception):  # this step's requests fail; the next runs without them
                    failed = self._fail_step(step, sampled, executor_failed=sampled is output)
                    scheduled = without_seqs(scheduled, failed, self.scheduler.batches)
                    previous = None
                elif scheduled.placeholder_rows:
                    _write_sampled_tokens(step, sampled, scheduled)
        progressed: list[Sequence] = []
        if previous is not None and self._num_constrained:
            # grammars take the previous step's tokens before the next step's bitmask is filled: no
            # overlap while a request of structured output runs
            progressed = self._postprocess_timed(previous[0], sampled)
            previous = None
        if scheduled.batch is not None or scheduled.has_transfers:
            if self._executor_thread is None:
                self._executor_thread = ExecutorThread()
            batch = self._constrained(scheduled) if scheduled.batch is not None else None
            submitted = scheduled if batch is scheduled.batch else dataclasses.replace(scheduled, batch=batch)
            self._running = (scheduled, self._executor_thread.submit(self.executor, submitted),
                             batch.token_bitmask if batch is not None else None)
        if previous is None:
            return progressed
        return self._postprocess_timed(previous[0], sampled)

    def _postprocess_timed(self, scheduled: ScheduledStep, sampled: Sampled) -> list[Sequence]:
        started = perf_counter()
        self._postprocess(scheduled, sampled)
        self.timings.postprocess_s += perf_counter() - started
        return scheduled.seqs

    def _complete(self, scheduled: ScheduledStep, output, bitmask=None) -> list[Sequence]:
        """Sample and postprocess a step whose executor ran (sync)."""
        if output is None:
            return []
        started = perf_counter()
        sampled = self._sample(scheduled, output, bitmask)
        if isinstance(sampled, Exception):
            self._fail_step(scheduled, sampled)
            return []
        self._postprocess(scheduled, sampled)
        self.timings.postprocess_s += perf_counter() - started
        return scheduled.seqs

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
        return self.scheduler.stats(num_queued_tokens=self._num_queued_tokens)

    def running_request_ids(self) -> list[str]:
        """The requests that are running (holding KV blocks) now."""
        return [seq.request_id for seq in self.scheduler.running]

    def shutdown(self) -> None:
        """Wait for a step still running (its outputs are dropped), then release the executor."""
        with self.guard:
            if self._executor_thread is not None:
                self._executor_thread.shutdown()
                self._executor_thread = self._running = None
            self.executor.shutdown()

    # -- internals --------------------------------------------------------------------------------
    def _new_entry(self, request: EngineRequest, request_id: str | None):
        """The request's sequence, or for n > 1 completions its ``ParallelRequest``; nothing is queued."""
        if request.params.num_samples == 1:
            return self._new_sequence(request, request_id)
        if request_id is None:
            request_id = self._auto_request_id(next(self._seq_counter))
        elif self._id_in_use(request_id):
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        children = [self._new_sequence(replace(request, params=child_params(request.params, i)),
                                       child_request_id(request_id, i)) for i in range(request.params.num_samples)]
        share_prompt = self.scheduler.prefix_caching and len(request.prompt_token_ids) > self.scheduler.allocator.block_size
        return ParallelRequest(request_id, request.params, children, share_prompt)

    def _queue_entry(self, entry, stream: bool = True) -> str:
        """Queue a sequence (or the first children of a ``ParallelRequest``); ``stream``: as for
        ``add_request``, for every child."""
        if isinstance(entry, ParallelRequest):
            for seq, _ in entry.children:
                seq.stream = stream
            self._parallel.add(entry)
            for seq, detokenizer in entry.to_queue():
                self._queue(seq, detokenizer)
            return entry.request_id
        entry[0].stream = stream
        self._queue(*entry)
        return entry[0].request_id

    def _abort_parallel(self, request_id: str) -> bool:
        live = [seq for seq, _ in self._parallel.get(request_id).children if not seq.status.is_done]
        for seq in live:
            self._finish(seq, reason=FinishReason.ABORT)
        return bool(live)

    def _id_in_use(self, request_id: str) -> bool:
        return request_id in self._seqs or request_id in self._held_outputs or self._parallel.owns(request_id)

    def _new_sequence(self, request: EngineRequest, request_id: str | None
                      ) -> tuple[Sequence, IncrementalDetokenizer]:
        """The request's sequence, checked against the engine's limits; nothing is queued yet."""
        if request_id is not None and self._id_in_use(request_id):
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        seq_id = next(self._seq_counter)
        request_id = request_id if request_id is not None else self._auto_request_id(seq_id)
        seq = Sequence(seq_id, request_id, request.prompt, list(request.prompt_token_ids), request.params,
                       time.time(), priority=request.priority, tenant=request.tenant)
        if request.grammar is not None:
            seq.grammar = self.structured_output.new_state(request.grammar)
        reason = self.scheduler.admission_error(seq)
        if reason is not None:
            raise InvalidRequestError(reason)
        return seq, IncrementalDetokenizer(self.tokenizer, seq.prompt_token_ids, seq.params, self._token_texts())

    def _token_texts(self) -> dict[int, str]:
        """The tokenizer's text of each single token decoded so far (kept per tokenizer)."""
        tokenizer = self.tokenizer
        if self._texts_of is not tokenizer:
            self._texts_of, self._texts = tokenizer, {}
        return self._texts

    def _queue(self, seq: Sequence, detokenizer: IncrementalDetokenizer) -> None:
        self._seqs[seq.request_id] = seq
        self._detokenizers[seq.seq_id] = detokenizer
        self.scheduler.add(seq)
        self._num_queued_tokens += _queued_tokens(seq)
        self._num_constrained += seq.grammar is not None
        log.info("request.admitted", request_id=seq.request_id, num_prompt_tokens=seq.num_prompt_tokens)

    def _reject(self, prompt, error: str) -> str:
        """A failed output for a prompt that ``add_requests()`` could not queue."""
        seq_id = next(self._seq_counter)
        seq = Sequence(seq_id, self._auto_request_id(seq_id), prompt_text(prompt), [], self.default_params, time.time())
        self._seqs[seq.request_id] = seq
        self._finish(seq, error=error)
        return seq.request_id

    def _auto_request_id(self, seq_id: int) -> str:
        """The sequence number as an id, suffixed if a caller already chose that id."""
        request_id, n = str(seq_id), 0
        while self._id_in_use(request_id):
            n += 1
            request_id = f"{seq_id}-{n}"
        return request_id

    def _fail_step(self, scheduled: ScheduledStep, exc: Exception, executor_failed: bool = False) -> set[int]:
        """The executor (or the sampler) failed on this step: its requests fail, nothing else; with
        ``executor_failed`` (its block transfers may not have run) so do the sequences it swapped out,
        whose K/V is lost (async: even if a later step swapped them back in). The failed seq ids."""
        seqs = scheduled.seqs + scheduled.swapped_out if executor_failed else scheduled.seqs
        log.error("executor.failed", num_seqs=len(seqs), error=f"{type(exc).__name__}: {exc}", exc_info=exc)
        for seq in seqs:
            if not seq.status.is_done:
                self._finish(seq, error=f"the executor failed on this request's batch: {type(exc).__name__}: {exc}")
        return {seq.seq_id for seq in seqs}

    def _constrained(self, scheduled: ScheduledStep):
        """The step's batch, with the token bitmask of its structured-output rows (if it has any)."""
        batch = scheduled.batch
        if not self._num_constrained:  # no work per step unless a request asks for structured output
            return batch
        # a sequence that ended meanwhile (async: stopped by the step before) is not constrained
        states = [None if s.status.is_done else s.grammar for s, flag in zip(scheduled.seqs, batch.sample) if flag]
        bitmask = self.structured_output.bitmask(states)
        return batch if bitmask is None else dataclasses.replace(batch, token_bitmask=bitmask)

    def _sample(self, scheduled: ScheduledStep, output, bitmask=None) -> Sampled | Exception:
        """(token id, logprobs, error) for each sampled row, or what went wrong for the whole step."""
        try:
            return self._next_tokens(scheduled, output, bitmask)
        except ExecutorDeadError:
            raise
        except Exception as exc:
            return exc

    def _next_tokens(self, scheduled: ScheduledStep, output, bitmask=None) -> Sampled:
        """(token id, logprobs, error) for each sampled row."""
        num_rows = sum(scheduled.batch.sample)
        if output.token_ids is not None:
            if len(output.token_ids) != num_rows:
                raise ValueError(f"executor returned {len(output.token_ids)} token ids for {num_rows} rows")
            vocab_size = max(self.tokenizer.vocab_size, getattr(self.executor, "vocab_size", 0) or 0)
            return [(t, None, _token_error(t, vocab_size)) for t in output.token_ids]
        from hetero_core.engine.sampler import Sampler, SamplingRow

        if self._sampler is None:
            self._sampler = Sampler(seed=self._sampler_seed, eos_token_id=self.tokenizer.eos_token_id)
        rows = [
            SamplingRow(s.params, s.prompt_token_ids, s.output_token_ids)
            for s, flag in zip(scheduled.seqs, scheduled.batch.sample) if flag
        ]
        result = self._sampler.sample(output.logits, rows, token_bitmask=bitmask)
        return [(t, lp, result.error(i)) for i, (t, lp) in enumerate(zip(result.token_ids, result.logprobs))]

    def _postprocess(self, scheduled: ScheduledStep, sampled: Sampled) -> None:
        """The step completed: confirm its tokens, append the sampled ones and check stops. A
        sequence that ended meanwhile (aborted, or stopped by the step before) is skipped."""
        if scheduled.swapped_in_tokens:
            confirm_swap_ins(scheduled)
        tokens = iter(sampled)
        now = time.time()
        eos_token_id = self.tokenizer.eos_token_id
        for seq, num_new, epoch, sample in zip(scheduled.seqs, scheduled.num_new_tokens, scheduled.kv_epochs,
                                               scheduled.batch.sample):
            if sample:
                token_id, logprobs, error = next(tokens)
            if seq.status.is_done:
                continue
            if seq.kv_epoch == epoch:  # not preempted (recompute) since: the K/V it wrote stays
                seq.num_inflight_tokens -= num_new
            if not sample:
                continue
            seq.num_pending_tokens -= 1
            if error is not None:
                self._finish(seq, error=error)
                continue
            seq.first_token_time = seq.first_token_time or now
            seq.output_token_ids.append(token_id)
            if len(seq.output_token_ids) <= seq.params.max_tokens:
                self._num_queued_tokens -= 1
            if seq.params.logprobs is not None:
                seq.output_logprobs.append(logprobs)
            if seq.grammar is not None and not seq.grammar.accept_token(token_id):
                self._finish(seq, error=f"token {token_id} is not allowed by the request's guided decoding "
                                        "(an executor that returns token ids must honour Batch.token_bitmask)")
                continue
            self._check_stop(seq, token_id, eos_token_id)
            if seq.grammar is not None and not seq.status.is_done and seq.grammar.is_terminated():
                self._finish(seq, reason=FinishReason.STOP)
        self.num_steps += 1
        self.timings.num_steps += 1
        log.debug("engine.step", step=self.num_steps, num_seqs=scheduled.batch.num_seqs,
                  num_tokens=scheduled.batch.num_tokens, num_preempted=len(scheduled.preempted),
                  num_free_blocks=self.scheduler.allocator.num_free_blocks)

    def _check_stop(self, seq: Sequence, token_id: int, eos_token_id: int | None) -> None:
        """The new token's stop checks (EOS and stop ids, its text and stop strings, length)."""
        params = seq.params
        if token_id == eos_token_id or params.stop_token_ids:
            reason = check_stop_token(seq, token_id, eos_token_id)
            if reason is not None:
                self._finish(seq, reason=reason)
                return
        try:
            delta = self._detokenizers[seq.seq_id].add(token_id)
        except Exception as exc:  # a tokenizer that cannot decode this id fails this request alone
            self._finish(seq, error=f"the tokenizer could not decode token {token_id}: {type(exc).__name__}: {exc}")
            return
        if delta:
            seq.output_text += delta
            if params.stop and check_stop_string(seq, len(delta)) is not None:
                self._finish(seq, reason=FinishReason.STOP, keep_held_text=False)  # text after the stop is cut
                return
        if (len(seq.output_token_ids) >= params.max_tokens
                or len(seq.prompt_token_ids) + len(seq.output_token_ids) >= self.max_model_len):
            self._finish(seq, reason=FinishReason.LENGTH)  # stop_checker.check_length, inline (per token)

    def _fail_unschedulable(self) -> None:
        """Nothing could be scheduled although requests wait: nothing will change, so fail them."""
        for seq in [s for s in self._seqs.values() if not s.status.is_done]:
            self._finish(seq, error=self.scheduler.unschedulable_error(seq))

    def _finish(self, seq: Sequence, reason: FinishReason | None = None, error: str | None = None,
                keep_held_text: bool = True) -> None:
        detokenizer = self._detokenizers.pop(seq.seq_id, None)
        if detokenizer is not None:  # the request was queued: release its place and blocks
            self.scheduler.remove(seq)
            self._num_queued_tokens -= _queued_tokens(seq)
            self._num_constrained -= seq.grammar is not None
            tail = _safe_flush(detokenizer)
            if keep_held_text:
                seq.output_text += tail
        seq.status = SequenceStatus.FAILED if error else SequenceStatus.FINISHED
        seq.finish_reason, seq.error, seq.finish_time = reason, error, time.time()
        self._finished_outputs.append(RequestOutput.from_sequence(seq))
        if error:
            log.warning("request.failed", request_id=seq.request_id, reason=error)
        else:
            log.info("request.finished", request_id=seq.request_id, finish_reason=reason.value,
                     num_output_tokens=seq.num_output_tokens, num_preemptions=seq.num_preemptions)


def _queued_tokens(seq: Sequence) -> int:
    """A queued request's prompt plus the output tokens it may still generate (up to ``max_tokens``)."""
    return seq.num_prompt_tokens + max(0, seq.params.max_tokens - seq.num_output_tokens)


def _write_sampled_tokens(previous: ScheduledStep, sampled: Sampled, scheduled: ScheduledStep) -> None:
    """Write the tokens ``previous`` sampled into ``scheduled``'s placeholder rows (async). A row
    whose token failed gets token 0: its request fails with ``previous``, and its result is dropped."""
    sampled_seqs = [s for s, flag in zip(previous.seqs, previous.batch.sample) if flag]
    token_of = {seq.seq_id: (token if error is None else 0) for seq, (token, _, error) in zip(sampled_seqs, sampled)}
    batch = scheduled.batch
    for row in scheduled.placeholder_rows:
        batch.token_ids[batch.query_start_loc[row + 1] - 1] = token_of[scheduled.seqs[row].seq_id]


def _token_error(token_id, vocab_size: int) -> str | None:
    if isinstance(token_id, int) and not isinstance(token_id, bool) and 0 <= token_id < vocab_size:
        return None
    return f"the executor returned token id {token_id!r}, outside the vocabulary [0, {vocab_size})"


def _safe_flush(detokenizer: IncrementalDetokenizer) -> str:
    try:
        return detokenizer.flush()
    except Exception:  # the text so far stands; the held tail is lost
        return ""
