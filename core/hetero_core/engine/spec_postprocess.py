"""SpeculativePostprocess: the end of a step that verified proposals (speculative decoding).

Each sampled sequence of such a step got a list of tokens (``spec_verify``): the proposals the target
kept and one token of its own. Its computed length is set back by the rejected proposals first (their
K/V slots stay in its blocks and are written again by the next steps; only K/V of kept tokens is ever
named in the prefix cache), then the tokens are appended one at a time through the usual checks
(EOS, stop ids, stop strings, ``max_tokens``, ``max_model_len``): a stop inside a kept run ends the
request there and drops the rest. While tokens are appended the computed length never passes the
tokens known, so a request finished mid-run names only blocks of tokens it has. A mixin of ``Engine``
beside ``postprocess`` (which calls it): it reads ``speculation`` and uses ``_finish`` and ``_check_stop``.
"""

from __future__ import annotations

import time

from hetero_core.engine.scheduled_step import ScheduledStep, confirm_swap_ins
from hetero_core.engine.sequence import FinishReason


class SpeculativePostprocess:
    """Confirm, roll back and append a verifying step's tokens (a part of ``Engine``)."""

    def _postprocess_speculative(self, scheduled: ScheduledStep, sampled) -> None:
        if scheduled.swapped_in_tokens:
            confirm_swap_ins(scheduled)
        tokens = iter(sampled)
        now = time.time()
        eos_token_id = self.tokenizer.eos_token_id
        for seq, num_new, epoch, sample, spec in zip(scheduled.seqs, scheduled.num_new_tokens, scheduled.kv_epochs,
                                                     scheduled.batch.sample, scheduled.spec_token_ids):
            if sample:
                token_ids, logprobs, error = next(tokens)
            if seq.status.is_done:
                continue
            same_kv = seq.kv_epoch == epoch
            if same_kv:
                seq.num_inflight_tokens -= num_new
            if not sample:
                continue
            seq.num_pending_tokens -= 1
            if error is not None:
                self._finish(seq, error=error)
                continue
            if spec:
                self.speculation.record(len(spec), len(token_ids) - 1)
                if same_kv:
                    seq.num_computed_tokens -= len(spec) - (len(token_ids) - 1)  # the rejected proposals
            valid_end = seq.num_computed_tokens
            seq.first_token_time = seq.first_token_time or now
            for token_id in token_ids:
                seq.output_token_ids.append(token_id)
                if spec and same_kv:
                    seq.num_computed_tokens = min(valid_end, seq.num_tokens)
                if len(seq.output_token_ids) <= seq.params.max_tokens:
                    self._num_queued_tokens -= 1
                if seq.params.logprobs is not None:
                    seq.output_logprobs.append(logprobs)
                if seq.grammar is not None and not seq.grammar.accept_token(token_id):
                    self._finish(seq, error=f"token {token_id} is not allowed by the request's guided decoding "
                                            "(an executor that returns token ids must honour Batch.token_bitmask)")
                    break
                self._check_stop(seq, token_id, eos_token_id)
                if seq.grammar is not None and not seq.status.is_done and seq.grammar.is_terminated():
                    self._finish(seq, reason=FinishReason.STOP)
                if seq.status.is_done:
                    break
