"""SamplingParams are validated once, with a message that names the field and the rule."""

import pytest

from hetero_core.engine.params import SamplingParams
from hetero_core.errors import InvalidRequestError


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"top_p": 0}, "top_p must be in (0, 1], got 0"),
        ({"temperature": -1}, "temperature must be >= 0, got -1"),
        ({"top_k": -2}, "top_k must be -1 (disabled), 0 (disabled) or >= 1, got -2"),
        ({"logprobs": 1000}, "logprobs must be in [0, 20], got 1000"),
        ({"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
        ({"min_p": 1.5}, "min_p must be in [0, 1]"),
        ({"repetition_penalty": 0}, "repetition_penalty must be > 0"),
        ({"presence_penalty": 3}, "presence_penalty must be in [-2, 2]"),
        ({"frequency_penalty": -3}, "frequency_penalty must be in [-2, 2]"),
        ({"stop": [""]}, "stop strings must be non-empty"),
        ({"stop_token_ids": [-1]}, "stop_token_ids must be non-negative"),
        ({"seed": "abc"}, "seed must be an integer"),
    ],
)
def test_bad_parameters_are_rejected_with_a_clear_message(kwargs, message):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kwargs)
    assert message in str(err.value)


def test_all_problems_are_reported_at_once():
    with pytest.raises(InvalidRequestError, match="temperature.*top_p"):
        SamplingParams(temperature=-1, top_p=2)


def test_a_single_stop_string_and_lists_are_normalised():
    params = SamplingParams(stop="###", stop_token_ids=[5, 6])
    assert params.stop == ("###",) and params.stop_token_ids == (5, 6)


def test_a_bad_request_fails_alone_in_a_batch(make_mock_engine):
    engine = make_mock_engine()
    ok = SamplingParams(temperature=0, max_tokens=4)
    outputs = engine.generate(["fine", "", [1, 2, 999999], "also fine"], ok)
    assert [o.error is None for o in outputs] == [True, False, False, True]
    assert "empty" in outputs[1].error and "out of range" in outputs[2].error
    assert all(len(o.output_token_ids) == 4 for o in (outputs[0], outputs[3]))
    engine.add_request("x", ok, request_id="dup")
    with pytest.raises(InvalidRequestError, match="already in use"):
        engine.add_request("y", ok, request_id="dup")


def test_automatic_request_ids_never_clash_with_chosen_ones(make_mock_engine):
    engine = make_mock_engine()
    ok = SamplingParams(temperature=0, max_tokens=2)
    engine.add_request("mine", ok, request_id="1")
    first = engine.add_request("auto", ok)
    second = engine.add_request("auto", ok)
    assert len({"1", first, second}) == 3
