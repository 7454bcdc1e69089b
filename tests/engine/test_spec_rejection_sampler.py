"""Verification of proposals (engine/speculation/spec_verify.py): for temperature > 0 the tokens
have the target's distribution whatever is proposed (sampled many times on a small vocabulary with
fixed logits, a fixed seed and a total-variation bound: it cannot flake); greedy keeps exactly the
argmax run."""

from __future__ import annotations

import random
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from hetero_core.engine.requests.params import SamplingParams  # noqa: E402
from hetero_core.engine.sampling.sampler import Sampler, SamplingRow  # noqa: E402
from hetero_core.engine.speculation.spec_verify import (  # noqa: E402
    rejection_sample,
    target_probs,
    verify_logits,
    verify_token_ids,
)

LOGITS = torch.tensor(
    [[2.0, 1.0, 0.5, 0.0, -1.0, 1.5], [0.0, 2.5, 1.0, 1.0, 0.5, -0.5], [1.0, 1.0, 1.0, 3.0, 0.0, 0.0]]
)
NUM_DRAWS = 12000
TV_BOUND = 0.03  # the draws' total-variation distance from the target: ~0.01 expected at 12000 draws


def reference_probs(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """softmax(logits / T) over the top_k best tokens, computed independently of the sampler's code."""
    scaled = logits.double() / temperature
    if top_k > 0:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    return scaled.softmax(dim=-1)


def total_variation(counts: Counter, probs: torch.Tensor) -> float:
    total = sum(counts.values())
    return 0.5 * sum(abs(counts.get(t, 0) / total - float(probs[t])) for t in range(probs.shape[0]))


def draw_many(probs: torch.Tensor, spec: list[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [rejection_sample(probs, spec, lambda j, purpose: rng.random()) for _ in range(NUM_DRAWS)]


@pytest.mark.parametrize(
    "temperature, top_k, spec",
    [
        (1.0, -1, [1, 1]),  # a likely then an unlikely proposal
        (0.7, 4, [4, 3]),  # the first proposal is outside the top 4: always rejected
        (1.3, -1, [0, 1]),  # the two best guesses
        (1.0, 2, [3, 5]),  # both outside the top 2
    ],
)
def test_tokens_have_the_target_distribution(temperature, top_k, spec):
    params = SamplingParams(temperature=temperature, top_k=top_k)
    probs = target_probs(LOGITS.clone(), params)
    expected = reference_probs(LOGITS, temperature, top_k)
    assert torch.allclose(probs.double(), expected, atol=1e-6)
    runs = draw_many(probs, spec)
    assert all(1 <= len(run) <= len(spec) + 1 and run[:-1] == spec[: len(run) - 1] for run in runs)
    # the first token ~ p_0; the second, given the first was the first proposal, ~ p_1; the bonus ~ p_2
    assert total_variation(Counter(run[0] for run in runs), expected[0]) < TV_BOUND
    for position in (1, 2):
        after = [run[position] for run in runs if len(run) > position]
        if len(after) >= 1500:  # enough of them to measure (a proposal outside top-k is never kept)
            assert (
                total_variation(Counter(after), expected[position])
                < TV_BOUND * (NUM_DRAWS / len(after)) ** 0.5
            )


def test_acceptance_is_the_target_probability_of_the_proposal():
    probs = target_probs(LOGITS.clone(), SamplingParams(temperature=1.0))
    runs = draw_many(probs, [0, 1], seed=3)
    kept_first = sum(len(run) > 1 for run in runs) / NUM_DRAWS
    assert abs(kept_first - float(probs[0, 0])) < 0.015


def test_a_certain_proposal_is_always_kept_and_an_impossible_one_never():
    probs = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5], [0.2, 0.3, 0.5]])
    for run in draw_many(probs, [1, 1])[:500]:
        assert run[0] == 1 and run[1] in (0, 2)  # kept, then rejected (p = 0) and drawn from the rest


def test_greedy_keeps_the_argmax_run_and_adds_the_next_argmax():
    sampler, greedy = Sampler(seed=0), SamplingParams(temperature=0)
    rows = [SamplingRow(greedy, [1], []), SamplingRow(greedy, [1], []), SamplingRow(greedy, [1], [])]
    # argmax rows: 0 -> 0, 1 -> 1, 2 -> 3; then a plain row (argmax 0), then a proposal rejected at once
    logits = torch.cat([LOGITS, LOGITS[:1], LOGITS[1:3]])
    out = verify_logits(sampler, logits, rows, [(0, 1), (), (2,)])
    assert [tokens for tokens, _, _ in out] == [[0, 1, 3], [0], [1]]
    assert all(error is None for _, _, error in out)


def test_seeded_requests_draw_the_same_tokens_every_time():
    params = SamplingParams(temperature=1.0, seed=42)
    rows = [SamplingRow(params, [1, 2], [3])]
    first = [verify_logits(Sampler(), LOGITS.clone(), rows, [(1, 1)])[0][0] for _ in range(5)]
    assert all(tokens == first[0] for tokens in first)


def test_non_finite_logits_fail_the_row_alone():
    logits = torch.cat([LOGITS[:2], torch.full((1, 6), float("nan")), LOGITS[:1]])
    greedy = SamplingParams(temperature=0)
    out = verify_logits(Sampler(), logits, [SamplingRow(greedy, [1], [])] * 2, [(0, 1), ()])
    assert out[0][2] is not None and "not finite" in out[0][2]
    assert out[1] == ([0], None, None)


def test_token_id_executors_are_verified_by_exact_match():
    # rows: seq 0 (proposals 5, 1): 5 6 7 -> 5 kept, 1 != 6: 6; seq 1 (none): 8;
    # seq 2 (proposal 9): 9 4 -> kept + bonus
    ids = [5, 6, 7, 8, 9, 4]
    assert verify_token_ids(ids, [(5, 1), (), (9,)], 10) == [
        ([5, 6], None, None),
        ([8], None, None),
        ([9, 4], None, None),
    ]
    ((tokens, _, error),) = verify_token_ids([3, 99], [(3,)], 10)
    assert tokens == [3, 99] and "outside the vocabulary" in error


def test_logits_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match="expected \\[3, vocab_size\\]"):
        verify_logits(Sampler(), LOGITS[:2], [SamplingRow(SamplingParams(temperature=0), [1], [])], [(1, 2)])
