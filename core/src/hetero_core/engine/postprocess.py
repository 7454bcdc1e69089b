"""Postprocessor: a step's tokens appended and checked, requests finished (the end of a step).

``postprocess`` confirms the step's tokens (in flight until now), appends each sampled row's tokens
and checks them one at a time (``accept``: the queued-token count, logprobs, the grammar, then
``check_stop``: EOS / stop ids, stop strings over the text it touched, length). A plain step gives a
row one token; a step that verified proposals gives it the kept ones and the target's own, appended
through the same ``accept`` after the rejected proposals are rolled back (``spec_postprocess``).
``finish`` ends a request (its blocks and detokenizer freed, its final output kept for ``step()``),
and ``fail_step`` / ``fail_unschedulable`` fail the requests of a step that went wrong or can never
run. All of it reads and writes the engine's one ``EngineState``.
"""

from __future__ import annotations

import time
from itertools import repeat

from hetero_core.engine.kv.kv_transfer import export_prompt_blocks
from hetero_core.engine.requests.detokenizer import IncrementalDetokenizer
from hetero_core.engine.requests.outputs import RequestOutput
from hetero_core.engine.requests.sequence import FinishReason, Sequence, SequenceStatus
from hetero_core.engine.requests.stop_checker import check_stop_string, check_stop_token
from hetero_core.engine.scheduling.scheduled_step import ScheduledStep, confirm_swap_ins
from hetero_core.engine.speculation.spec_postprocess import append_verified
from hetero_core.engine.state import EngineState
from hetero_core.engine.step_sampler import Sampled
from hetero_core.logging import get_logger

__all__ = ["Postprocessor", "queued_tokens"]
log = get_logger("hetero.engine")


class Postprocessor:
    def __init__(self, state: EngineState) -> None:
        self.state = state

    def postprocess(self, scheduled: ScheduledStep, sampled: Sampled) -> None:
        """The step completed: confirm its tokens, append the sampled ones and check stops. A
        sequence that ended meanwhile (aborted, or stopped by the step before) is skipped."""
        if scheduled.swapped_in_tokens:
            confirm_swap_ins(scheduled)
        tokens, accept, now = iter(sampled), self.accept, time.time()
        eos_token_id = self.state.tokenizer.eos_token_id
        # a plain step samples a token a row; one that verified proposals, each row's kept ones and its own
        specs = repeat(None) if scheduled.spec_token_ids is None else scheduled.spec_token_ids
        for seq, num_new, epoch, sample, spec in zip(
            scheduled.seqs, scheduled.num_new_tokens, scheduled.kv_epochs, scheduled.batch.sample, specs
        ):
            if sample:
                token, logprobs, error = next(tokens)
            if seq.status.is_done:
                continue
            same_kv = seq.kv_epoch == epoch  # not preempted (recompute) since: the K/V it wrote stays
            if same_kv:
                seq.num_inflight_tokens -= num_new
            if not sample:
                continue
            seq.num_pending_tokens -= 1
            if error is not None:
                self.finish(seq, error=error)
                continue
            seq.first_token_time = seq.first_token_time or now
            if spec is None:
                seq.output_token_ids.append(token)
                accept(seq, token, logprobs, eos_token_id)
            else:  # the same, a token at a time, for the proposals kept and the target's token
                append_verified(self, seq, token, logprobs, spec, same_kv, eos_token_id)
        self._count_step(scheduled)

    def accept(self, seq: Sequence, token_id: int, logprobs, eos_token_id: int | None) -> None:
        """The checks of a token just appended to ``seq`` (which may end it)."""
        if len(seq.output_token_ids) <= seq.params.max_tokens:
            self.state.num_queued_tokens -= 1
        if seq.params.logprobs is not None:
            seq.output_logprobs.append(logprobs)
        grammar = seq.grammar
        if grammar is not None and not grammar.accept_token(token_id):
            self.finish(
                seq,
                error=f"token {token_id} is not allowed by the request's guided decoding "
                "(an executor that returns token ids must honour Batch.token_bitmask)",
            )
            return
        self.check_stop(seq, token_id, eos_token_id)
        if grammar is not None and not seq.status.is_done and grammar.is_terminated():
            self.finish(seq, reason=FinishReason.STOP)

    def _count_step(self, scheduled: ScheduledStep) -> None:
        timings = self.state.timings
        timings.num_steps += 1
        log.debug(
            "engine.step",
            step=timings.num_steps,
            num_seqs=scheduled.batch.num_seqs,
            num_tokens=scheduled.batch.num_tokens,
            num_preempted=len(scheduled.preempted),
            num_free_blocks=self.state.scheduler.allocator.num_free_blocks,
        )

    def check_stop(self, seq: Sequence, token_id: int, eos_token_id: int | None) -> None:
        """The new token's stop checks (EOS and stop ids, its text and stop strings, length)."""
        params = seq.params
        if token_id == eos_token_id or params.stop_token_ids:
            reason = check_stop_token(seq, token_id, eos_token_id)
            if reason is not None:
                self.finish(seq, reason=reason)
                return
        try:
            delta = self.state.detokenizers[seq.seq_id].add(token_id)
        except Exception as exc:  # a tokenizer that cannot decode this id fails this request alone
            self.finish(
                seq, error=f"the tokenizer could not decode token {token_id}: {type(exc).__name__}: {exc}"
            )
            return
        if delta:
            seq.output_text += delta
            if params.stop and check_stop_string(seq, len(delta)) is not None:
                self.finish(seq, reason=FinishReason.STOP, keep_held_text=False)  # text after the stop is cut
                return
        num_output, max_model_len = len(seq.output_token_ids), self.state.processor.max_model_len
        if num_output >= params.max_tokens or len(seq.prompt_token_ids) + num_output >= max_model_len:
            self.finish(seq, reason=FinishReason.LENGTH)  # stop_checker.check_length, inline (per token)

    def fail_unschedulable(self) -> None:
        """Nothing could be scheduled although requests wait: nothing will change, so fail them."""
        for seq in [s for s in self.state.seqs.values() if not s.status.is_done]:
            self.finish(seq, error=self.state.scheduler.unschedulable_error(seq))

    def finish(
        self,
        seq: Sequence,
        reason: FinishReason | None = None,
        error: str | None = None,
        keep_held_text: bool = True,
    ) -> None:
        """End ``seq``: its place, blocks and detokenizer released, its final output kept for ``step()``."""
        state = self.state
        detokenizer = state.detokenizers.pop(seq.seq_id, None)
        if detokenizer is not None:  # the request was queued: release its place and blocks
            if seq.export_kv and error is None and reason is not FinishReason.ABORT:
                block_size = state.scheduler.allocator.block_size
                seq.kv_export, error = export_prompt_blocks(state.executor, seq, block_size)
            state.scheduler.remove(seq)
            if state.speculation is not None:
                state.speculation.release(seq)
            state.num_queued_tokens -= queued_tokens(seq)
            state.num_constrained -= seq.grammar is not None
            tail = _safe_flush(detokenizer)
            if keep_held_text:
                seq.output_text += tail
        seq.status = SequenceStatus.FAILED if error else SequenceStatus.FINISHED
        seq.finish_reason, seq.error, seq.finish_time = reason, error, time.time()
        state.finished_outputs.append(RequestOutput.from_sequence(seq))
        if error:
            log.warning("request.failed", request_id=seq.request_id, reason=error)
        else:
            log.info(
                "request.finished",
                request_id=seq.request_id,
                finish_reason=reason.value,
                num_output_tokens=seq.num_output_tokens,
                num_preemptions=seq.num_preemptions,
            )

    def fail_step(self, scheduled: ScheduledStep, exc: Exception, executor_failed: bool = False) -> set[int]:
        """The executor (or the sampler) failed on this step: its requests fail, nothing else; with
        ``executor_failed`` (its block transfers may not have run) so do the sequences it swapped out,
        whose K/V is lost (async: even if a later step swapped them back in). The failed seq ids."""
        seqs = scheduled.seqs + scheduled.swapped_out if executor_failed else scheduled.seqs
        log.error("executor.failed", num_seqs=len(seqs), error=f"{type(exc).__name__}: {exc}", exc_info=exc)
        error = f"the executor failed on this request's batch: {type(exc).__name__}: {exc}"
        for seq in seqs:
            if not seq.status.is_done:
                self.finish(seq, error=error)
        return {seq.seq_id for seq in seqs}


def queued_tokens(seq: Sequence) -> int:
    """A queued request's prompt plus the output tokens it may still generate (up to ``max_tokens``)."""
    return seq.num_prompt_tokens + max(0, seq.params.max_tokens - seq.num_output_tokens)


def _safe_flush(detokenizer: IncrementalDetokenizer) -> str:
    try:
        return detokenizer.flush()
    except Exception:  # the text so far stands; the held tail is lost
        return ""
