"""SamplingParams are validated once, with a message that names the field and the rule."""

from fractions import Fraction

import pytest

from hetero_core.engine.requests.params import GREEDY_TEMPERATURE, SamplingParams
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
        ({"repetition_penalty": 0}, "repetition_penalty must be between 0.0001 and 10000"),
        ({"repetition_penalty": 1e-45}, "repetition_penalty must be between 0.0001 and 10000"),
        ({"temperature": float("inf")}, "temperature must be finite"),
        ({"temperature": float("nan")}, "temperature must be >= 0, got nan"),
        ({"temperature": "0.5"}, "temperature must be a number, got '0.5' (str)"),
        ({"top_p": None}, "top_p must be a number, got None"),
        ({"top_k": True}, "top_k must be an integer, got True (bool)"),
        ({"max_tokens": 3.0}, "max_tokens must be an integer, got 3.0 (float)"),
        ({"logprobs": 1.5}, "logprobs must be an integer or None, got 1.5 (float)"),
        ({"logprobs": True}, "logprobs must be an integer or None, got True (bool)"),
        ({"seed": 1.0}, "seed must be an integer or None"),
        ({"stop": 5}, "stop must be a string, a list of strings or None, got 5 (int)"),
        ({"stop": ["ok", 5]}, "stop must be a string, a list of strings or None"),
        ({"stop": ["\ud800"]}, "lone surrogate"),
        ({"stop_token_ids": 5}, "stop_token_ids must be a list of integers or None"),
        ({"stop_token_ids": [1.0]}, "stop_token_ids must be a list of integers or None"),
        ({"ignore_eos": 1}, "ignore_eos must be true or false, got 1 (int)"),
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


def test_ints_are_accepted_for_floats_and_stored_as_floats():
    params = SamplingParams(temperature=1, top_p=1, repetition_penalty=2)
    assert params.temperature == 1.0 and isinstance(params.temperature, float)
    assert isinstance(params.repetition_penalty, float)


@pytest.mark.parametrize("temperature", [1e-38, 5e-324, 9.9e-6, 0.0])
def test_temperatures_below_the_floor_are_greedy(temperature):
    params = SamplingParams(temperature=temperature)
    assert params.temperature == 0.0 and params.is_greedy


def test_a_temperature_at_the_floor_stays_random():
    assert not SamplingParams(temperature=GREEDY_TEMPERATURE).is_greedy


@pytest.mark.parametrize("seed", [0, -1, 2**63, 2**64, -(2**70), 10**40])
def test_seeds_accept_any_int(seed):
    assert SamplingParams(seed=seed).seed == seed


def test_none_means_no_stop_strings_and_no_stop_ids_as_in_vllm():
    params = SamplingParams(stop=None, stop_token_ids=None)
    assert params.stop == () and params.stop_token_ids == ()


def test_from_dict_names_unknown_fields_with_a_suggestion():
    assert SamplingParams.from_dict({"temperature": 0, "max_tokens": 3}).max_tokens == 3
    with pytest.raises(
        InvalidRequestError,
        match="unknown sampling parameter 'temprature' \\(did you mean 'temperature'\\?\\); "
        "valid: temperature",
    ):
        SamplingParams.from_dict({"temprature": 0})
    with pytest.raises(InvalidRequestError, match="must be a SamplingParams or a dict, got list"):
        SamplingParams.from_dict([("temperature", 0)])


@pytest.mark.parametrize(
    "kwargs", [{"temperature": 1e-38}, {"temperature": 1e-5, "repetition_penalty": 1e-4}]
)
def test_extreme_but_accepted_values_sample_in_vocabulary(kwargs):
    torch = pytest.importorskip("torch")
    from hetero_core.engine.sampling.sampler import Sampler, SamplingRow

    logits = torch.randn(2, 500, generator=torch.Generator().manual_seed(1)) * 30
    rows = [SamplingRow(SamplingParams(seed=3, **kwargs), list(range(400)), list(range(50)))] * 2
    out = Sampler(seed=0).sample(logits, rows)
    assert out.errors is None and all(0 <= t < 500 for t in out.token_ids)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": 10**400}, "temperature must be a number within the float range"),
        ({"top_p": Fraction(10**400, 3)}, "top_p must be a number within the float range"),
        ({"min_p": -(10**400)}, "min_p must be a number within the float range"),
        (
            {"presence_penalty": Fraction(10**5000, 7)},
            "presence_penalty must be a number within the float range",
        ),
        ({"max_tokens": -(10**5000)}, "max_tokens must be >= 1, got a negative integer of 16610 bits"),
        ({"top_k": -(10**400)}, "top_k must be -1 (disabled), 0 (disabled) or >= 1, got a negative integer"),
    ],
)
def test_numbers_beyond_floats_and_printing_are_a_clear_error(kwargs, message):
    """An int or fraction too large for a float was an OverflowError (or a 4,300-digit ValueError)."""
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kwargs)
    assert message in str(err.value) and len(str(err.value)) < 300


def test_a_huge_unknown_key_is_named_briefly():
    with pytest.raises(InvalidRequestError, match="unknown sampling parameter an integer of"):
        SamplingParams.from_dict({10**5000: 1})
