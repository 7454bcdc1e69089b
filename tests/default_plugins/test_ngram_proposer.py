"""The built-in ngram proposer (prompt lookup) and the proposer contract kit."""

from __future__ import annotations

import pytest

from hetero_core.default_plugins.ngram_options import NgramOptions
from hetero_core.default_plugins.ngram_proposer import NgramProposer, propose_ngram
from hetero_core.speculative import ProposalInput, ProposerContext
from hetero_core.testing import ContractFailure, ProposerContract


class TestNgramProposer(ProposerContract):
    def make_proposer(self, ctx):
        return NgramProposer(ctx)


class TestNgramProposerLongLookups(ProposerContract):
    options = NgramOptions(prompt_lookup_min=2, prompt_lookup_max=6)

    def make_proposer(self, ctx):
        return NgramProposer(ctx)


def test_proposes_what_followed_the_latest_earlier_occurrence():
    #            0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 3, 4, 9, 2, 3, 5, 6, 2, 3]
    assert propose_ngram(tokens, 3, 1, 4) == [5, 6, 2]  # "2 3" last seen at 5..6, followed by 5 6 2


def test_the_longest_suffix_that_recurs_wins():
    tokens = [7, 1, 2, 3, 8, 8, 9, 2, 3, 4, 4, 1, 2, 3]
    assert propose_ngram(tokens, 2, 1, 3) == [8, 8]  # "1 2 3" beats the later "2 3"
    assert propose_ngram(tokens, 2, 1, 2) == [4, 4]  # capped at 2: the latest "2 3"


def test_no_match_or_too_short_proposes_nothing():
    assert propose_ngram([1, 2, 3, 4], 3, 1, 4) == []
    assert propose_ngram([5], 3, 1, 4) == []
    assert propose_ngram([1, 2, 1, 2], 0, 1, 4) == []
    assert propose_ngram([1, 2, 9, 1, 2], 3, 3, 4) == []  # only a 2-gram recurs, min is 3


def test_a_match_near_the_end_continues_the_repeat():
    assert propose_ngram([4, 4, 4], 5, 1, 2) == [4] * 5  # "4 4" at 0..1, followed by the last 4, and so on
    assert propose_ngram([5, 1, 2, 3, 1, 2, 3, 1, 2], 4, 2, 4) == [3, 1, 2, 3]  # period 3


def test_unaligned_byte_matches_are_not_token_matches():
    # 256 = 00 01 00 00 and 1 = 01 00 00 00 (little endian): byte-level hits that are no token hits
    tokens = [256, 1, 0, 0, 0, 1]
    assert propose_ngram(tokens, 2, 1, 1) == [0, 0]  # the real "1" at index 1


def test_token_ids_above_the_byte_range():
    tokens = [49151, 30000, 7, 49151, 30000]
    assert propose_ngram(tokens, 3, 1, 2) == [7, 49151, 30000]


def test_proposer_reads_its_options_and_caps_each_input():
    options = NgramOptions(prompt_lookup_min=1, prompt_lookup_max=2)
    ctx = ProposerContext(options, 4, 100, None, "mock", 16, 512, 8)
    proposer = NgramProposer(ctx)
    inputs = [ProposalInput(0, (1, 2, 3, 1, 2), 2), ProposalInput(1, (5, 6), 3)]
    assert proposer.propose(inputs) == [[3, 1], []]


def test_options_follow_vllm_min_max_rules():
    assert NgramOptions(prompt_lookup_max=3).prompt_lookup_min == 3  # only the max given: min follows it
    assert NgramOptions(prompt_lookup_min=2).prompt_lookup_max == 2
    assert (NgramOptions().prompt_lookup_min, NgramOptions().prompt_lookup_max) == (2, 4)
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        NgramOptions(prompt_lookup_min=5, prompt_lookup_max=3)


def test_the_kit_catches_a_proposal_outside_the_vocabulary():
    class Wild:
        def __init__(self, ctx):
            self.vocab_size = ctx.vocab_size

        def propose(self, inputs):
            return [[self.vocab_size] for _ in inputs]

        def release(self, seq_id):
            pass

        def shutdown(self):
            pass

    class TestWild(ProposerContract):
        def make_proposer(self, ctx):
            return Wild(ctx)

    with pytest.raises(ContractFailure, match="vocab_size"):
        TestWild().test_proposals_are_lists_of_ids_within_the_vocabulary()


def test_the_kit_catches_too_many_tokens_and_nondeterminism():
    import itertools

    counter = itertools.count()

    class Greedy:
        def __init__(self, ctx):
            pass

        def propose(self, inputs):
            return [[next(counter) % 10] * (i.num_tokens + 1) for i in inputs]

        def release(self, seq_id):
            pass

        def shutdown(self):
            pass

    class Drifting(Greedy):
        def propose(self, inputs):
            return [[next(counter) % 10] for _ in inputs]

    class TestGreedy(ProposerContract):
        def make_proposer(self, ctx):
            return Greedy(ctx)

    class TestDrifting(ProposerContract):
        def make_proposer(self, ctx):
            return Drifting(ctx)

    with pytest.raises(ContractFailure, match="at most num_tokens"):
        TestGreedy().test_proposals_are_lists_of_ids_within_the_vocabulary()
    with pytest.raises(ContractFailure, match="same proposals"):
        TestDrifting().test_proposals_are_deterministic()


def test_the_packed_tokens_kept_between_steps_follow_the_sequence():
    proposer = NgramProposer(
        ProposerContext(NgramOptions(prompt_lookup_min=1), 3, 100, None, "mock", 16, 512, 8)
    )
    tokens = [1, 2, 3, 9, 1, 2]
    assert proposer.propose([ProposalInput(0, tuple(tokens), 3)]) == [[3, 9, 1]]
    tokens += [3, 9]  # grows: only the new tokens are packed
    assert proposer.propose([ProposalInput(0, tuple(tokens), 3)]) == [[1, 2, 3]]
    other = [5, 6, 7, 5]  # the same id with other tokens, without release: packed again, not mixed up
    assert proposer.propose([ProposalInput(0, tuple(other), 3)]) == [[6, 7, 5]]
    proposer.release(0)
    proposer.release(0)
    assert proposer.propose([ProposalInput(0, (8, 8), 3)]) == [[8, 8, 8]]  # a run of one token continues
