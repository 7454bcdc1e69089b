"""The architecture kit's greedy reference: HF's plain forward over the whole sequence, recomputed for
each token (never its KV cache), with near ties flagged; an engine token that differs from it is
accepted only at a near tie. Test doubles, no transformers."""

from __future__ import annotations

import types

import pytest
import torch

from hetero_core.testing import ArchitectureContract
from hetero_core.testing.contract_failure import ContractFailure

VOCAB = 8


class SumModel:
    """Next token (sum of the tokens so far + 1) % VOCAB; the runner-up 0.5 below, or 1e-4 below when
    the sequence is 6 tokens long (a near tie). A call with a KV cache is refused."""

    def __init__(self):
        self.lengths = []

    def __call__(self, input_ids, **cache):
        if cache:
            raise AssertionError(f"the reference used HF's cache: {sorted(cache)}")
        tokens = input_ids[0].tolist()
        self.lengths.append(len(tokens))
        logits = torch.zeros(len(tokens), VOCAB)
        for position in range(len(tokens)):
            best = (sum(tokens[: position + 1]) + 1) % VOCAB
            logits[position, best] = 1.0
            logits[position, (best + 1) % VOCAB] = 1.0 - (1e-4 if position == 5 else 0.5)
        return types.SimpleNamespace(logits=logits[None])


class Kit(ArchitectureContract):
    def __init__(self):
        self.model = SumModel()

    def hf_model(self):
        return self.model


def test_each_token_is_the_argmax_of_a_forward_over_the_whole_sequence():
    kit = Kit()
    got = kit.hf_greedy([3, 2], 5)
    tokens = [3, 2]
    for _ in range(5):
        tokens.append((sum(tokens) + 1) % VOCAB)
    assert [token for token, _ in got] == tokens[2:]
    assert kit.model.lengths == [2, 3, 4, 5, 6]  # one plain forward per token, the whole sequence each time
    assert [near_tie for _, near_tie in got] == [False, False, False, False, True]  # length 6: the near tie


def test_an_engine_token_off_the_reference_passes_only_at_a_near_tie():
    kit = Kit()
    expected = [(4, False), (5, True), (7, False)]
    kit._check_greedy([1], [4, 6, 0], expected, "tie")  # parts at the tie: accepted, the rest not compared
    with pytest.raises(ContractFailure, match="greedy token 0 .* is 3, HF's is 4"):
        kit._check_greedy([1], [3, 5, 7], expected, "no tie")
