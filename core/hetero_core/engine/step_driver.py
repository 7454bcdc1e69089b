"""StepDriver: how a scheduled step runs on the executor (the middle part of ``Engine.step()``).

``_step_sync`` runs the step and postprocesses it. ``_step_async`` (async scheduling) finishes the
step running on the executor thread (``executor_thread``), writes its sampled tokens into the newly
scheduled step's placeholder rows, starts that step and postprocesses the finished one. A step
interrupted by ``KeyboardInterrupt`` is undone (``scheduled_step.unschedule``): stepping again
redoes it. A mixin of ``Engine``: it reads ``executor``, ``scheduler``, ``structured_output``,
``timings`` and ``_num_constrained``, owns ``_executor_thread`` and ``_running`` (the step on the
thread, its future, its bitmask), and samples, postprocesses and fails steps through
``postprocess``'s ``_sample``, ``_postprocess`` and ``_fail_step``.
"""

from __future__ import annotations

import dataclasses
from time import perf_counter

from hetero_core.engine.block_transfer import apply_block_transfers
from hetero_core.engine.executor_thread import ExecutorThread
from hetero_core.engine.postprocess import Sampled
from hetero_core.engine.scheduled_step import ScheduledStep, unschedule, without_seqs
from hetero_core.engine.sequence import Sequence
from hetero_core.errors import ExecutorDeadError
from hetero_core.logging import get_logger

log = get_logger("hetero.engine")


class StepDriver:
    """Run a scheduled step, in sync or on the executor thread (a part of ``Engine``)."""

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

    def _constrained(self, scheduled: ScheduledStep):
        """The step's batch, with the token bitmask of its structured-output rows (if it has any)."""
        batch = scheduled.batch
        if not self._num_constrained:  # no work per step unless a request asks for structured output
            return batch
        # a sequence that ended meanwhile (async: stopped by the step before) is not constrained
        states = [None if s.status.is_done else s.grammar for s, flag in zip(scheduled.seqs, batch.sample) if flag]
        bitmask = self.structured_output.bitmask(states)
        return batch if bitmask is None else dataclasses.replace(batch, token_bitmask=bitmask)


def _write_sampled_tokens(previous: ScheduledStep, sampled: Sampled, scheduled: ScheduledStep) -> None:
    """Write the tokens ``previous`` sampled into ``scheduled``'s placeholder rows (async). A row
    whose token failed gets token 0: its request fails with ``previous``, and its result is dropped."""
    sampled_seqs = [s for s, flag in zip(previous.seqs, previous.batch.sample) if flag]
    token_of = {seq.seq_id: (token if error is None else 0) for seq, (token, _, error) in zip(sampled_seqs, sampled)}
    batch = scheduled.batch
    for row in scheduled.placeholder_rows:
        batch.token_ids[batch.query_start_loc[row + 1] - 1] = token_of[scheduled.seqs[row].seq_id]
