"""StepDriver: a scheduled step run on the executor, sampled and postprocessed (``Engine.step()``'s middle).

``run_sync`` runs the step, samples it (``StepSampler``) and postprocesses it (``Postprocessor``).
``run_async`` (async scheduling) finishes the step running on the executor thread
(``executor_thread``), writes its sampled tokens into the newly scheduled step's placeholder rows,
starts that step and postprocesses the finished one. A step interrupted by ``KeyboardInterrupt`` is
undone (``scheduled_step.unschedule``): stepping again redoes it. Its own state: the executor thread
(started at the first async step) and the step running there; the rest is the engine's
``EngineState``.

``run_pipelined`` (an executor declaring ``pipelined_steps``: pipeline stages) keeps two steps in
flight, as vLLM's virtual engines do: it starts a step (``executor.start_step``, which returns once
the first stage is done with it) and, once two are in flight or nothing new could be scheduled,
finishes the oldest (``executor.finish_step``), samples and postprocesses it. The scheduler leaves
the sequences of a step in flight out of the next (``Scheduler.skip_pending``), so the two steps
hold disjoint sequences and need no placeholder tokens: stage 0 runs step t+1 while the last stage
finishes step t. Block transfers wait for the steps in flight (the executor reads their outputs
first), so they reach every stage after the steps scheduled before them, as without pipelining.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from time import perf_counter

from hetero_core.engine.executor_thread import ExecutorThread
from hetero_core.engine.kv.block_transfer import apply_block_transfers
from hetero_core.engine.postprocess import Postprocessor
from hetero_core.engine.requests.sequence import Sequence
from hetero_core.engine.scheduling.scheduled_step import ScheduledStep, unschedule, without_seqs
from hetero_core.engine.state import EngineState
from hetero_core.engine.step_sampler import Sampled, StepSampler
from hetero_core.errors import ExecutorDeadError

__all__ = ["StepDriver"]


class StepDriver:
    def __init__(self, state: EngineState, sampler: StepSampler, postprocessor: Postprocessor) -> None:
        self.state = state
        self.sampler = sampler
        self.postprocessor = postprocessor
        self.executor_thread: ExecutorThread | None = None  # started at the first async step
        # async: the step on the thread, its future (the executor's output) and its token bitmask
        self.running: tuple[ScheduledStep, object, object] | None = None
        self.in_flight: deque[tuple[ScheduledStep, object]] = deque()  # pipelined: started, not finished

    @property
    def is_running(self) -> bool:
        """Whether a step runs on the executor thread (async scheduling) or is in flight (pipelined)."""
        return self.running is not None or bool(self.in_flight)

    def run_sync(self, scheduled: ScheduledStep) -> list[Sequence]:
        """Run the step and postprocess it; the sequences it ran."""
        if scheduled.batch is None and not scheduled.has_transfers:
            return []
        state, started = self.state, perf_counter()
        try:
            apply_block_transfers(state.executor, scheduled)
            batch = self._constrained(scheduled) if scheduled.batch is not None else None
            output = state.executor.execute(batch) if batch is not None else None
        except ExecutorDeadError:  # nothing can run any more (e.g. a tensor-parallel worker died)
            raise
        except Exception as exc:  # a failing executor fails this batch's requests, not the engine
            state.timings.execute_s += perf_counter() - started
            self.postprocessor.fail_step(scheduled, exc, executor_failed=True)
            return []
        except BaseException:  # KeyboardInterrupt: the step did not happen; stepping again redoes it
            unschedule(scheduled)
            raise
        state.timings.execute_s += perf_counter() - started
        return self._complete(scheduled, output, batch.token_bitmask if batch is not None else None)

    def run_async(self, scheduled: ScheduledStep) -> list[Sequence]:
        """Finish the running step, start ``scheduled``, postprocess the finished one; the
        sequences it ran."""
        previous, self.running = self.running, None
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
            self.state.timings.execute_s += perf_counter() - started
            if step.batch is None and not isinstance(output, Exception):  # block transfers only, done
                previous = None
            else:
                failed = isinstance(output, Exception)
                sampled = output if failed else self.sampler.sample(step, output, bitmask)
                if isinstance(sampled, Exception):  # this step's requests fail; the next runs without them
                    failed = self.postprocessor.fail_step(step, sampled, executor_failed=sampled is output)
                    scheduled = without_seqs(scheduled, failed, self.state.scheduler.batches)
                    previous = None
                elif scheduled.placeholder_rows:
                    _write_sampled_tokens(step, sampled, scheduled)
        progressed: list[Sequence] = []
        if previous is not None and self.state.num_constrained:
            # grammars take the previous step's tokens before the next step's bitmask is filled: no
            # overlap while a request of structured output runs
            progressed = self._postprocess_timed(previous[0], sampled)
            previous = None
        if scheduled.batch is not None or scheduled.has_transfers:
            if self.executor_thread is None:
                self.executor_thread = ExecutorThread()
            batch = self._constrained(scheduled) if scheduled.batch is not None else None
            submitted = scheduled if batch is scheduled.batch else dataclasses.replace(scheduled, batch=batch)
            self.running = (
                scheduled,
                self.executor_thread.submit(self.state.executor, submitted),
                batch.token_bitmask if batch is not None else None,
            )
        if previous is None:
            return progressed
        return self._postprocess_timed(previous[0], sampled)

    def run_pipelined(self, scheduled: ScheduledStep, depth: int = 2) -> list[Sequence]:
        """Start ``scheduled``; finish the oldest step in flight once ``depth`` are, or when nothing
        new was scheduled; the sequences it ran (none while the pipeline fills)."""
        state = self.state
        if scheduled.batch is not None or scheduled.has_transfers:
            started = perf_counter()
            try:
                apply_block_transfers(state.executor, scheduled)
                batch = self._constrained(scheduled) if scheduled.batch is not None else None
                if batch is not None:
                    state.executor.start_step(batch)
            except ExecutorDeadError:
                raise
            except Exception as exc:  # fails this batch's requests, not the engine
                state.timings.execute_s += perf_counter() - started
                self.postprocessor.fail_step(scheduled, exc, executor_failed=True)
                return []
            except BaseException:  # KeyboardInterrupt: the step did not happen; stepping again redoes it
                unschedule(scheduled)
                raise
            state.timings.execute_s += perf_counter() - started
            if batch is not None:
                self.in_flight.append((scheduled, batch.token_bitmask))
        if not self.in_flight or (len(self.in_flight) < depth and scheduled.batch is not None):
            return []
        step, bitmask = self.in_flight.popleft()
        started = perf_counter()
        try:
            output = state.executor.finish_step()
        except ExecutorDeadError:
            raise
        except Exception as exc:
            state.timings.execute_s += perf_counter() - started
            self.postprocessor.fail_step(step, exc, executor_failed=True)
            return []
        state.timings.execute_s += perf_counter() - started
        return self._complete(step, output, bitmask)

    def shutdown(self) -> None:
        """Wait for a step still running (its outputs are dropped) and end the executor thread."""
        if self.executor_thread is not None:
            self.executor_thread.shutdown()
            self.executor_thread = self.running = None
        while self.in_flight:  # pipelined: their outputs are dropped
            self.in_flight.popleft()
            try:
                self.state.executor.finish_step()
            except Exception:  # noqa: BLE001 - stopping anyway (a dead group says so at its shutdown)
                break

    def _postprocess_timed(self, scheduled: ScheduledStep, sampled: Sampled) -> list[Sequence]:
        started = perf_counter()
        self.postprocessor.postprocess(scheduled, sampled)
        self.state.timings.postprocess_s += perf_counter() - started
        return scheduled.seqs

    def _complete(self, scheduled: ScheduledStep, output, bitmask=None) -> list[Sequence]:
        """Sample and postprocess a step whose executor ran (sync)."""
        if output is None:
            return []
        started = perf_counter()
        sampled = self.sampler.sample(scheduled, output, bitmask)
        if isinstance(sampled, Exception):
            self.postprocessor.fail_step(scheduled, sampled)
            return []
        self.postprocessor.postprocess(scheduled, sampled)
        self.state.timings.postprocess_s += perf_counter() - started
        return scheduled.seqs

    def _constrained(self, scheduled: ScheduledStep):
        """The step's batch, with the token bitmask of its structured-output rows (if it has any)."""
        batch, state = scheduled.batch, self.state
        if not state.num_constrained:  # no work per step unless a request asks for structured output
            return batch
        # a sequence that ended meanwhile (async: stopped by the step before) is not constrained
        states = [
            None if s.status.is_done else s.grammar for s, flag in zip(scheduled.seqs, batch.sample) if flag
        ]
        bitmask = state.structured_output.bitmask(states)
        return batch if bitmask is None else dataclasses.replace(batch, token_bitmask=bitmask)


def _write_sampled_tokens(previous: ScheduledStep, sampled: Sampled, scheduled: ScheduledStep) -> None:
    """Write the tokens ``previous`` sampled into ``scheduled``'s placeholder rows (async). A row
    whose token failed gets token 0: its request fails with ``previous``, and its result is dropped."""
    sampled_seqs = [s for s, flag in zip(previous.seqs, previous.batch.sample) if flag]
    token_of = {
        seq.seq_id: (token if error is None else 0) for seq, (token, _, error) in zip(sampled_seqs, sampled)
    }
    batch = scheduled.batch
    for row in scheduled.placeholder_rows:
        batch.token_ids[batch.query_start_loc[row + 1] - 1] = token_of[scheduled.seqs[row].seq_id]
