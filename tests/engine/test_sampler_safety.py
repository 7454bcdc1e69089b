"""The sampler never emits an id outside the vocabulary: a row whose logits are not usable fails
alone (with a reason), every other row is sampled as usual."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from hetero_core.engine.requests.params import SamplingParams  # noqa: E402
from hetero_core.engine.sampling.sampler import Sampler, SamplingRow  # noqa: E402

GREEDY = SamplingParams(temperature=0)
RANDOM = SamplingParams(temperature=0.8, top_p=0.9, seed=1)
LOGPROBS = SamplingParams(temperature=0, logprobs=2)


def rows(*params):
    return [SamplingRow(p, [1, 2], [3]) for p in params]


def clean_logits(num_rows, vocab=50):
    logits = torch.full((num_rows, vocab), -5.0)
    logits[:, 7] = 5.0  # token 7 is the clear winner everywhere
    return logits


@pytest.mark.parametrize("params", [GREEDY, RANDOM, LOGPROBS], ids=["greedy", "random", "logprobs"])
@pytest.mark.parametrize("poison", ["nan", "inf", "all -inf"])
def test_a_broken_row_fails_alone(params, poison):
    logits = clean_logits(3)
    if poison == "all -inf":
        logits[1] = float("-inf")
    else:
        logits[1, 3] = float(poison)
    out = Sampler(seed=0).sample(logits, rows(params, params, params))
    assert out.errors[0] is None and out.errors[2] is None
    assert "not finite" in out.errors[1] and out.error(1) == out.errors[1]
    assert out.token_ids[0] == out.token_ids[2] == 7
    assert out.token_ids[1] == 0 and out.logprobs[1] is None
    if params.logprobs is not None:
        assert out.logprobs[0].token_id == 7


def test_minus_inf_entries_alone_are_fine():
    logits = clean_logits(1)
    logits[0, :7] = float("-inf")
    out = Sampler().sample(logits, rows(RANDOM))
    assert out.errors is None and out.token_ids == [7]


def test_logits_that_overflow_under_temperature_fail_with_a_hint():
    logits = clean_logits(2)
    logits[0, 7] = 3e38  # finite, but 3e38 / 0.5 is inf in float32
    hot = SamplingParams(temperature=0.5, seed=2)
    out = Sampler().sample(logits, rows(hot, hot))
    assert "penalties or temperature made this request's logits non-finite" in out.errors[0]
    assert out.errors[1] is None and out.token_ids[1] == 7


def test_clean_batches_report_no_errors():
    out = Sampler().sample(clean_logits(3), rows(GREEDY, RANDOM, LOGPROBS))
    assert out.errors is None and out.token_ids == [7, 7, 7]


VALUES = st.one_of(
    st.floats(-50, 50), st.sampled_from([float("nan"), float("inf"), float("-inf"), 3e38, -3e38])
)
PARAMS = st.sampled_from(
    [
        GREEDY,
        RANDOM,
        LOGPROBS,
        SamplingParams(temperature=1e-38),
        SamplingParams(temperature=1e-5, seed=3),
        SamplingParams(repetition_penalty=1e-4, temperature=0.3),
        SamplingParams(repetition_penalty=1e4, top_k=3),
        SamplingParams(min_p=0.5, frequency_penalty=2, presence_penalty=-2),
    ]
)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), num_rows=st.integers(1, 4), vocab=st.integers(1, 40))
def test_every_id_is_in_the_vocabulary_or_the_row_failed(data, num_rows, vocab):
    logits = torch.tensor(
        data.draw(
            st.lists(st.lists(VALUES, min_size=vocab, max_size=vocab), min_size=num_rows, max_size=num_rows)
        ),
        dtype=torch.float32,
    )
    params = data.draw(st.lists(PARAMS, min_size=num_rows, max_size=num_rows))
    out = Sampler(seed=0).sample(logits, [SamplingRow(p, [0, vocab - 1], [0]) for p in params])
    for i, token_id in enumerate(out.token_ids):
        assert 0 <= token_id < vocab
        finite_row = bool(torch.isfinite(logits[i]).all())
        if finite_row and abs(float(logits[i].abs().max())) < 1e3:
            assert out.error(i) is None, out.error(i)  # ordinary logits never fail
        if out.error(i) is None:
            assert float(logits[i, token_id]) > float("-inf")  # never a masked token
