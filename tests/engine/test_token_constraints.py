"""SamplingParams' token constraints in the sampler (engine/sampling/logits_constraints.py):
allowed_token_ids, bad_words, min_tokens and logit_bias, batched with rows that have none."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hetero_core.engine.requests.params import SamplingParams  # noqa: E402
from hetero_core.engine.sampling.logits_constraints import banned_words  # noqa: E402
from hetero_core.engine.sampling.sampler import Sampler, SamplingRow  # noqa: E402

EOS = 9
VOCAB = 20


def logits(num_rows):
    """Token 7 best, then 3, then 5, everywhere."""
    out = torch.full((num_rows, VOCAB), -4.0)
    out[:, 7], out[:, 3], out[:, 5], out[:, EOS] = 6.0, 5.0, 4.0, 5.5
    return out


def sample(*rows, seed=0):
    return Sampler(seed=seed, eos_token_id=EOS).sample(logits(len(rows)), list(rows)).token_ids


def row(output=(), **params):
    return SamplingRow(SamplingParams(temperature=0, **params), [1, 2], list(output))


PLAIN = row()


def test_allowed_token_ids_bind_greedy_and_random_rows():
    assert sample(row(allowed_token_ids=[3, 5]), PLAIN) == [3, 7]
    hot = SamplingRow(SamplingParams(temperature=2.0, allowed_token_ids=[4, 11]), [1], [])
    for seed in range(10):
        assert Sampler(seed=seed).sample(logits(1), [hot]).token_ids[0] in (4, 11)


def test_logit_bias_moves_the_choice_and_leaves_other_rows_alone():
    assert sample(row(logit_bias={3: 2.0}), PLAIN, row(logit_bias={"5": 100})) == [3, 7, 5]
    assert sample(row(logit_bias={7: -100})) == [EOS]


def test_bad_words_ban_single_tokens_and_the_last_token_of_a_started_word():
    one_token = SamplingParams(temperature=0, bad_words_token_ids=[[7]])
    two_tokens = SamplingParams(temperature=0, bad_words_token_ids=[[4, 7]])
    rows = [
        SamplingRow(one_token, [1], []),
        SamplingRow(two_tokens, [1], [4]),
        SamplingRow(two_tokens, [1], [5]),
    ]
    assert Sampler().sample(logits(3), rows).token_ids == [EOS, EOS, 7]
    assert banned_words([[1, 2, 3], [8]], [0, 1, 2]) == [3, 8]
    assert banned_words([[1, 2, 3]], [2]) == []


def test_min_tokens_holds_back_eos_and_stop_ids_until_reached():
    eos_first = row(logit_bias={EOS: 10.0}, min_tokens=2)
    assert sample(eos_first) == [7]
    assert sample(row(output=[7], logit_bias={EOS: 10.0}, min_tokens=2)) == [7]
    assert sample(row(output=[7, 7], logit_bias={EOS: 10.0}, min_tokens=2)) == [EOS]
    assert sample(row(stop_token_ids=[7], min_tokens=1)) == [3]  # EOS and the stop id 7 held back
    assert sample(row(stop_token_ids=[7], min_tokens=1, ignore_eos=True, logit_bias={EOS: 10.0})) == [EOS]


def test_constrained_rows_do_not_change_their_neighbours_in_a_batch():
    mixed = [PLAIN, row(allowed_token_ids=[5]), PLAIN, row(logit_bias={3: 5.0}), PLAIN]
    assert sample(*mixed) == [7, 5, 7, 3, 7]
    assert sample(PLAIN, PLAIN) == [7, 7]


def test_a_row_left_with_no_token_fails_alone_with_a_hint():
    banned = SamplingParams(temperature=0, allowed_token_ids=[EOS], min_tokens=3)
    out = Sampler(eos_token_id=EOS).sample(logits(2), [SamplingRow(banned, [1], []), PLAIN])
    assert "token constraints" in out.errors[0] and out.errors[1] is None and out.token_ids[1] == 7


def test_logprobs_stay_those_of_the_raw_logits():
    params = SamplingParams(temperature=0, logprobs=1, allowed_token_ids=[3])
    out = Sampler().sample(logits(1), [SamplingRow(params, [1], [])])
    raw = logits(1).log_softmax(-1)
    assert out.token_ids == [3]
    assert out.logprobs[0].logprob == pytest.approx(float(raw[0, 3]))
    assert out.logprobs[0].top[0][0] == 7
