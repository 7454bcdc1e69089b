"""ProposerContract: the tests every speculative-decoding proposer passes, as a mixin its author subclasses.

    from hetero_core.testing import ProposerContract

    class TestMyProposer(ProposerContract):
        def make_proposer(self, ctx):
            return MyProposer(ctx)

Each test plays the engine's part: it calls ``propose`` with sequences that grow step by step (some
accepting part of what was proposed, as verification would), releases sequences and proposes for
them again. The rules (a broken one raises ``ContractFailure`` naming it):

- ``propose`` returns one list per input, in order, of at most ``num_tokens`` ints in ``[0, vocab_size)``;
- the same inputs give the same proposals (proposals are deterministic: verification assumes a
  one-hot draft distribution);
- ``release`` is idempotent, takes a sequence it never saw, and a released sequence can come back
  with the same ``seq_id`` and different tokens (a preempted one does);
- ``shutdown`` works after use.

``make_context`` builds the ``ProposerContext`` (override it to point ``model_dir`` at a model, or to
pass your options). Imports neither torch nor pytest.
"""

from __future__ import annotations

import random

from hetero_core.engine.speculation.proposer import ProposalInput, ProposerContext
from hetero_core.testing.contract_failure import ContractFailure

__all__ = ["ProposerContract"]


class ProposerContract:
    """Mix into a test class and define ``make_proposer(ctx)`` (ctx: ``ProposerContext``)."""

    vocab_size: int = 64
    num_speculative_tokens: int = 4
    options = None  # the context's options (your options model instance), if your proposer needs them
    model_dir = None
    executor: str = "mock"
    seeds: tuple[int, ...] = (0, 1, 2)

    def make_proposer(self, ctx: ProposerContext):
        raise NotImplementedError("subclass ProposerContract and implement make_proposer(ctx)")

    def make_context(self) -> ProposerContext:
        return ProposerContext(
            options=self.options,
            num_speculative_tokens=self.num_speculative_tokens,
            vocab_size=self.vocab_size,
            model_dir=self.model_dir,
            executor=self.executor,
            block_size=4,
            max_model_len=512,
            max_num_seqs=8,
            eos_token_id=None,
        )

    def sequences(self, seed: int) -> list[list[int]]:
        """Prompts with repeats (so that a lookup proposer finds something) and without."""
        rng = random.Random(seed)
        phrase = [rng.randrange(self.vocab_size) for _ in range(5)]
        return [
            phrase * 4,
            [rng.randrange(self.vocab_size) for _ in range(23)],
            phrase + [1, 2] + phrase[:3],
            [7],
        ]

    def propose(self, proposer, inputs: list[ProposalInput]) -> list[list[int]]:
        proposals = proposer.propose(inputs)
        if not isinstance(proposals, list) or len(proposals) != len(inputs):
            raise ContractFailure(
                "propose returns a list with one entry per input",
                f"{len(inputs)} inputs, got {proposals!r:.200}",
            )
        for given, tokens in zip(inputs, proposals):
            if not isinstance(tokens, list) or len(tokens) > given.num_tokens:
                raise ContractFailure(
                    "each proposal is a list of at most num_tokens ids",
                    f"seq {given.seq_id} num_tokens={given.num_tokens}: {tokens!r:.200}",
                )
            bad = [
                t
                for t in tokens
                if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size
            ]
            if bad:
                raise ContractFailure(
                    f"proposed ids are ints in [0, vocab_size={self.vocab_size})",
                    f"seq {given.seq_id}: {bad[:5]}",
                )
        return proposals

    def decode(self, proposer, seed: int, num_steps: int = 12) -> list[list[list[int]]]:
        """Grow every sequence step by step; each step keeps a random part of its proposal (as
        verification would) and adds one token. Every step's proposals, per step."""
        rng = random.Random(seed)
        seqs = self.sequences(seed)
        history = []
        for _ in range(num_steps):
            inputs = [
                ProposalInput(i, tuple(tokens), rng.randint(1, self.num_speculative_tokens))
                for i, tokens in enumerate(seqs)
            ]
            proposals = self.propose(proposer, inputs)
            history.append(proposals)
            for tokens, proposal in zip(seqs, proposals):
                tokens += proposal[: rng.randint(0, len(proposal))]
                tokens.append(rng.randrange(self.vocab_size))
        return history

    def test_proposals_are_lists_of_ids_within_the_vocabulary(self):
        proposer = self.make_proposer(self.make_context())
        try:
            for seed in self.seeds:
                self.decode(proposer, seed)
        finally:
            proposer.shutdown()

    def test_proposals_are_deterministic(self):
        for seed in self.seeds:
            first, second = self.make_proposer(self.make_context()), self.make_proposer(self.make_context())
            try:
                a, b = self.decode(first, seed), self.decode(second, seed)
            finally:
                first.shutdown()
                second.shutdown()
            if a != b:
                step = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
                raise ContractFailure(
                    "the same inputs give the same proposals",
                    f"seed {seed}, step {step}: {a[step]} then {b[step]}",
                )

    def test_release_is_idempotent_and_a_released_sequence_can_return(self):
        proposer = self.make_proposer(self.make_context())
        try:
            proposer.release(12345)  # never seen
            seqs = self.sequences(0)
            inputs = [ProposalInput(i, tuple(s), self.num_speculative_tokens) for i, s in enumerate(seqs)]
            self.propose(proposer, inputs)
            for i in range(len(seqs)):
                proposer.release(i)
                proposer.release(i)
            # preempted and back: the same seq ids, other tokens (a shorter recompute of another prompt)
            again = [
                ProposalInput(i, tuple(reversed(s)), self.num_speculative_tokens) for i, s in enumerate(seqs)
            ]
            fresh = self.make_proposer(self.make_context())
            try:
                if self.propose(proposer, again) != self.propose(fresh, again):
                    raise ContractFailure(
                        "a released sequence comes back as new",
                        "proposals for re-added seq ids differ from a fresh proposer's",
                    )
            finally:
                fresh.shutdown()
        finally:
            proposer.shutdown()

    def test_an_empty_step_proposes_nothing(self):
        proposer = self.make_proposer(self.make_context())
        try:
            if proposer.propose([]) != []:
                raise ContractFailure("propose([]) returns []", "got something else")
        finally:
            proposer.shutdown()
