"""Speculation: the engine's side of speculative decoding (its proposer, what may speculate, counters).

Once per step, before the scheduler runs, ``propose`` asks the proposer
(``engine/speculation/proposer.py``) for the running sequences that may speculate and leaves each
one's proposal in ``seq.spec_token_ids``;
the scheduler schedules such a sequence with ``1 + len(proposal)`` tokens when the token budget and
the KV pool allow (fewer, or none, when they do not), and core's sampler verifies them
(``spec_verify``). A sequence speculates when it decodes one token with nothing pending, has room for
at least one more token than the next (``max_tokens``, ``max_model_len``), and its request uses
nothing that does not compose with verification: structured output, penalties, token constraints
(``bad_words``, ``min_tokens``, ``allowed_token_ids``, ``logit_bias``) and ``logprobs`` run
unspeculated, in the same batches. ``release`` tells the proposer that a sequence is gone or was
preempted.

A proposer that raises, or returns something that is not a list of ids per input within the
vocabulary and the asked count, costs its proposals for that step (logged once), never a request.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetero_core.engine.requests.sequence import Sequence, SequenceStatus
from hetero_core.engine.speculation.proposer import ProposalInput
from hetero_core.logging import get_logger

__all__ = ["Speculation", "SpeculationStats", "can_speculate"]
log = get_logger("hetero.speculation")
DECODE = SequenceStatus.DECODE


@dataclass(frozen=True)
class SpeculationStats:
    """Counters since the engine started (vLLM's spec-decode metrics)."""

    num_drafts: int = 0  # sequence-steps that verified at least one proposed token
    num_draft_tokens: int = 0  # proposed tokens verified by the target
    num_accepted_tokens: int = 0  # of those, the ones the target kept

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens generated per verifying sequence-step: accepted proposals plus the target's own."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None


def can_speculate(seq: Sequence) -> bool:
    """Whether ``seq``'s request composes with verification (its features, not its state)."""
    params = seq.params
    return (
        seq.grammar is None
        and params.logprobs is None
        and not params.has_penalties
        and not params.has_token_constraints
    )


class Speculation:
    """``proposer`` (a ``Proposer``), ``num_speculative_tokens`` (k), the vocabulary it must stay in."""

    def __init__(
        self,
        proposer,
        num_speculative_tokens: int,
        max_model_len: int,
        vocab_size: int,
        name: str = "proposer",
    ) -> None:
        self.proposer = proposer
        self.num_speculative_tokens = num_speculative_tokens
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.name = name
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self._warned = False

    def stats(self) -> SpeculationStats:
        return SpeculationStats(self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens)

    def propose(self, running: list[Sequence]) -> None:
        """Set ``spec_token_ids`` of every running sequence: its proposal, or () when it does not
        speculate."""
        inputs, seqs = [], []
        k, max_model_len = self.num_speculative_tokens, self.max_model_len
        for seq in running:
            seq.spec_token_ids = ()
            if seq.status is not DECODE or seq.num_pending_tokens or seq.num_uncomputed_tokens != 1:
                continue
            num_tokens = min(
                k, seq.params.max_tokens - len(seq.output_token_ids) - 1, max_model_len - seq.num_tokens - 1
            )
            if num_tokens < 1 or not can_speculate(seq):
                continue
            inputs.append(ProposalInput(seq.seq_id, seq.prompt_token_ids + seq.output_token_ids, num_tokens))
            seqs.append(seq)
        if not inputs:
            return
        try:
            proposals = self.proposer.propose(inputs)
            problem = self._problem(inputs, proposals)
        except Exception as exc:  # a proposal is only a guess: a broken proposer costs speed, not requests
            proposals, problem = None, f"propose raised {type(exc).__name__}: {exc}"
        if problem is not None:
            self._warn(problem)
            return
        for seq, proposal in zip(seqs, proposals):
            seq.spec_token_ids = tuple(proposal)

    def record(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """One sequence-step verified ``num_draft_tokens`` proposals and kept ``num_accepted_tokens``."""
        if num_draft_tokens:
            self.num_drafts += 1
            self.num_draft_tokens += num_draft_tokens
            self.num_accepted_tokens += num_accepted_tokens

    def release(self, seq: Sequence) -> None:
        """``seq`` finished, failed, was aborted or preempted: the proposer drops its state."""
        seq.spec_token_ids = ()
        try:
            self.proposer.release(seq.seq_id)
        except Exception as exc:
            self._warn(f"release raised {type(exc).__name__}: {exc}")

    def shutdown(self) -> None:
        self.proposer.shutdown()

    def _problem(self, inputs: list[ProposalInput], proposals) -> str | None:
        if not isinstance(proposals, list) or len(proposals) != len(inputs):
            return (
                f"propose returned {type(proposals).__name__} for {len(inputs)} inputs "
                "(needs one list per input)"
            )
        vocab_size = self.vocab_size
        for given, tokens in zip(inputs, proposals):
            if not isinstance(tokens, (list, tuple)) or len(tokens) > given.num_tokens:
                return f"seq {given.seq_id}: {tokens!r:.80} is not a list of at most {given.num_tokens} ids"
            for token in tokens:
                if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < vocab_size:
                    return f"seq {given.seq_id}: token {token!r} outside the vocabulary [0, {vocab_size})"
        return None

    def _warn(self, problem: str) -> None:
        if not self._warned:  # once: a broken proposer would otherwise log every step
            log.warning("speculation.proposals_dropped", proposer=self.name, reason=problem)
            self._warned = True
