"""StepSampler: the executor's output of a step turned into a token per sampled row.

Token ids from the executor are checked against the vocabulary; logits go through core's sampler
(``sampler``, created at the first logits output: it imports torch). A step that verified
proposals (speculative decoding) gets a list of token ids per row instead: the kept proposals and
the target's own token (``spec_verify``). Prompt logprobs of the step's prompt rows are added on
the way (``prompt_logprobs``).
"""

from __future__ import annotations

from hetero_core.engine.sampling.prompt_logprobs import add_prompt_logprobs
from hetero_core.engine.scheduling.scheduled_step import ScheduledStep
from hetero_core.engine.state import EngineState
from hetero_core.errors import ExecutorDeadError

__all__ = ["Sampled", "StepSampler"]
# (token id, logprobs, error) per sampled row; a step that verified proposals has a list of token ids
# per row instead (the kept proposals and the target's own token: ``spec_verify``)
Sampled = list[tuple[int | list[int], object, str | None]]


class StepSampler:
    def __init__(self, state: EngineState, seed: int | None = None) -> None:
        self.state = state
        self.seed = seed  # the sampler's seed for requests without their own
        self._sampler = None  # core's Sampler, created on the first logits output (imports torch)

    def sample(self, scheduled: ScheduledStep, output, bitmask=None) -> Sampled | Exception:
        """(token id, logprobs, error) for each sampled row, or what went wrong for the whole step."""
        try:
            return self._next_tokens(scheduled, output, bitmask)
        except ExecutorDeadError:
            raise
        except Exception as exc:
            return exc

    def _next_tokens(self, scheduled: ScheduledStep, output, bitmask) -> Sampled:
        state, batch = self.state, scheduled.batch
        tokenizer = state.tokenizer
        num_rows = batch.num_sampled_rows
        add_prompt_logprobs(
            scheduled, output.prompt_logits, lambda token_id: state.token_texts.text(tokenizer, token_id)
        )
        specs = (
            None
            if scheduled.spec_token_ids is None
            else [spec for spec, flag in zip(scheduled.spec_token_ids, batch.sample) if flag]
        )
        if output.token_ids is not None:
            if len(output.token_ids) != num_rows:
                raise ValueError(f"executor returned {len(output.token_ids)} token ids for {num_rows} rows")
            vocab_size = max(tokenizer.vocab_size, state.executor.capabilities.vocab_size or 0)
            if specs is not None:
                from hetero_core.engine.speculation.spec_verify import verify_token_ids

                return verify_token_ids(output.token_ids, specs, vocab_size)
            return [(t, None, _token_error(t, vocab_size)) for t in output.token_ids]
        from hetero_core.engine.sampling.sampler import Sampler, SamplingRow

        if self._sampler is None:
            self._sampler = Sampler(seed=self.seed, eos_token_id=tokenizer.eos_token_id)
        rows = [
            SamplingRow(s.params, s.prompt_token_ids, s.output_token_ids)
            for s, flag in zip(scheduled.seqs, batch.sample)
            if flag
        ]
        if specs is not None:
            from hetero_core.engine.speculation.spec_verify import verify_logits

            return verify_logits(self._sampler, output.logits, rows, specs, token_bitmask=bitmask)
        result = self._sampler.sample(output.logits, rows, token_bitmask=bitmask)
        return [(t, lp, result.error(i)) for i, (t, lp) in enumerate(zip(result.token_ids, result.logprobs))]


def _token_error(token_id, vocab_size: int) -> str | None:
    if isinstance(token_id, int) and not isinstance(token_id, bool) and 0 <= token_id < vocab_size:
        return None
    return f"the executor returned token id {token_id!r}, outside the vocabulary [0, {vocab_size})"
