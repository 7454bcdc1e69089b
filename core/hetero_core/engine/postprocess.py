"""Postprocess: a step's tokens sampled, appended and checked; requests finished (the end of a step).

``_sample`` turns the executor's output into a token per sampled row (token ids checked against
the vocabulary, or logits through core's sampler); ``_postprocess`` confirms the step's tokens,
appends the sampled ones, advances grammars and runs the stop checks of the new token alone
(``_check_stop``: EOS / stop ids, stop strings over the text it touched, length); ``_finish`` ends
a request (its blocks and detokenizer freed, its final output kept for ``step()``), and
``_fail_step`` / ``_fail_unschedulable`` fail the requests of a step that went wrong or can never
run. A mixin of ``Engine``: it reads ``tokenizer``, ``executor``, ``scheduler``, ``max_model_len``
and ``_detokenizers``, and keeps ``num_steps``, ``timings``, ``_sampler``, ``_num_queued_tokens``,
``_num_constrained`` and ``_finished_outputs`` up to date.
"""

from __future__ import annotations

import time

from hetero_core.engine.detokenizer import IncrementalDetokenizer
from hetero_core.engine.kv_transfer import export_prompt_blocks
from hetero_core.engine.outputs import RequestOutput
from hetero_core.engine.prompt_logprobs import add_prompt_logprobs
from hetero_core.engine.scheduled_step import ScheduledStep, confirm_swap_ins
from hetero_core.engine.sequence import FinishReason, Sequence, SequenceStatus
from hetero_core.engine.spec_postprocess import SpeculativePostprocess
from hetero_core.engine.stop_checker import check_stop_string, check_stop_token
from hetero_core.errors import ExecutorDeadError
from hetero_core.logging import get_logger

log = get_logger("hetero.engine")
# (token id, logprobs, error) per sampled row; a step that verified proposals has a list of token ids
# per row instead (the kept proposals and the target's own token: ``spec_verify``)
Sampled = list[tuple[int | list[int], object, str | None]]


class Postprocess(SpeculativePostprocess):
    """Sample a step's tokens, check stops, finish requests (a part of ``Engine``)."""

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
        batch = scheduled.batch
        num_rows = batch.num_sampled_rows
        add_prompt_logprobs(scheduled, output.prompt_logits, self._token_text)
        specs = None if scheduled.spec_token_ids is None else [
            spec for spec, flag in zip(scheduled.spec_token_ids, batch.sample) if flag]
        if output.token_ids is not None:
            if len(output.token_ids) != num_rows:
                raise ValueError(f"executor returned {len(output.token_ids)} token ids for {num_rows} rows")
            vocab_size = max(self.tokenizer.vocab_size, self.executor.capabilities.vocab_size or 0)
            if specs is not None:
                from hetero_core.engine.spec_verify import verify_token_ids

                return verify_token_ids(output.token_ids, specs, vocab_size)
            return [(t, None, _token_error(t, vocab_size)) for t in output.token_ids]
        from hetero_core.engine.sampler import Sampler, SamplingRow

        if self._sampler is None:
            self._sampler = Sampler(seed=self._sampler_seed, eos_token_id=self.tokenizer.eos_token_id)
        rows = [
            SamplingRow(s.params, s.prompt_token_ids, s.output_token_ids)
            for s, flag in zip(scheduled.seqs, batch.sample) if flag
        ]
        if specs is not None:
            from hetero_core.engine.spec_verify import verify_logits

            return verify_logits(self._sampler, output.logits, rows, specs, token_bitmask=bitmask)
        result = self._sampler.sample(output.logits, rows, token_bitmask=bitmask)
        return [(t, lp, result.error(i)) for i, (t, lp) in enumerate(zip(result.token_ids, result.logprobs))]

    def _postprocess(self, scheduled: ScheduledStep, sampled: Sampled) -> None:
        """The step completed: confirm its tokens, append the sampled ones and check stops. A
        sequence that ended meanwhile (aborted, or stopped by the step before) is skipped."""
        if scheduled.spec_token_ids is not None:  # a step that verified proposals: several tokens a row
            self._postprocess_speculative(scheduled, sampled)
            self._count_step(scheduled)
            return
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
        self._count_step(scheduled)

    def _count_step(self, scheduled: ScheduledStep) -> None:
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
            if seq.export_kv and error is None and reason is not FinishReason.ABORT:
                seq.kv_export, error = export_prompt_blocks(self.executor, seq, self.scheduler.allocator.block_size)
            self.scheduler.remove(seq)
            if self.speculation is not None:
                self.speculation.release(seq)
            self._num_queued_tokens -= queued_tokens(seq)
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


def queued_tokens(seq: Sequence) -> int:
    """A queued request's prompt plus the output tokens it may still generate (up to ``max_tokens``)."""
    return seq.num_prompt_tokens + max(0, seq.params.max_tokens - seq.num_output_tokens)


def _token_error(token_id, vocab_size: int) -> str | None:
    if isinstance(token_id, int) and not isinstance(token_id, bool) and 0 <= token_id < vocab_size:
        return None
    return f"the executor returned token id {token_id!r}, outside the vocabulary [0, {vocab_size})"


def _safe_flush(detokenizer: IncrementalDetokenizer) -> str:
    try:
        return detokenizer.flush()
    except Exception:  # the text so far stands; the held tail is lost
        return ""
