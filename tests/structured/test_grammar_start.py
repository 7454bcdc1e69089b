"""Guided output whose token constraints leave its grammar no first token is refused at intake, before any
engine work, naming the fields; constraints that leave a first token, and a grammar complete at its start
(EOS ends it), are served. Mock executor, byte tokenizer: a token is a byte. The real tokenizer and
sampler (``min_tokens`` beyond the grammar too), through the server: ``test_grammar_start_real_model.py``."""

from __future__ import annotations

import pytest

from hetero_core import InvalidRequestError, SamplingParams

pytest.importorskip("xgrammar", reason="structured output needs: pip install 'hetero-core[structured]'")
YES_NO = {"choice": ["yes", "no"]}


@pytest.fixture
def engine(make_mock_engine):
    """A mock engine whose executor fails the test if any step runs."""
    engine = make_mock_engine(max_model_len=512)

    def no_step(batch):
        raise AssertionError("a refused request reached the executor")

    engine.executor.execute = no_step
    return engine


@pytest.mark.parametrize(
    "params, fields",
    [
        (dict(guided_decoding=YES_NO, allowed_token_ids=[ord("m")]), ["allowed_token_ids"]),
        (dict(guided_decoding={"json_object": True}, allowed_token_ids=[ord("a")]), ["allowed_token_ids"]),
        (dict(guided_decoding=YES_NO, bad_words=["y", "n"]), ["bad_words"]),
        (
            dict(guided_decoding=YES_NO, allowed_token_ids=[ord("y"), ord("m")], bad_words=["y"]),
            ["allowed_token_ids", "bad_words"],
        ),
        (
            dict(guided_decoding=YES_NO, min_tokens=3, stop_token_ids=[ord("y"), ord("n")]),
            ["min_tokens"],
        ),
    ],
    ids=["allowed", "json-object-allowed", "bad-words", "allowed-and-bad-words", "min-tokens-stop-ids"],
)
def test_a_grammar_left_no_first_token_is_refused_at_intake_naming_the_fields(engine, params, fields):
    with pytest.raises(InvalidRequestError) as refused:
        engine.add_request("x", SamplingParams(max_tokens=8, **params))
    message = str(refused.value)
    assert all(field in message for field in fields), message
    assert "guided_decoding" in message and "executor" not in message
    assert not engine.has_unfinished_requests()


def test_the_message_names_the_format_and_the_tokens_it_starts_with(engine):
    with pytest.raises(InvalidRequestError) as refused:
        engine.add_request("x", SamplingParams(guided_decoding=YES_NO, allowed_token_ids=[ord("m")]))
    message = str(refused.value)
    assert "guided_choice" in message and f"[{ord('n')}, {ord('y')}]" in message, message


def test_generate_fails_only_the_refused_request(make_mock_engine):
    engine = make_mock_engine(max_model_len=512)
    outputs = engine.generate(
        ["refused", "served"],
        [
            SamplingParams(guided_decoding=YES_NO, allowed_token_ids=[ord("m")]),
            SamplingParams(guided_decoding=YES_NO, allowed_token_ids=[ord("y"), ord("e"), ord("s")]),
        ],
    )
    assert "allowed_token_ids" in outputs[0].error
    assert outputs[1].error is None and outputs[1].text in ("yes", "no")  # the mock picks by the bitmask


@pytest.mark.parametrize(
    "params",
    [
        dict(guided_decoding=YES_NO, allowed_token_ids=[ord("n"), ord("o")]),  # one way through is enough
        dict(guided_decoding=YES_NO, bad_words=["yes", "no"]),  # a longer word cannot match at the start
        dict(guided_decoding=YES_NO, min_tokens=3),  # min_tokens holds back EOS, which the start lacks
        dict(guided_decoding={"regex": "a?"}, allowed_token_ids=[ord("b")]),  # complete at the start: EOS
    ],
    ids=["allowed-one-way", "bad-words-longer", "min-tokens", "complete-at-start"],
)
def test_constraints_that_leave_a_first_token_are_not_refused(make_mock_engine, params):
    engine = make_mock_engine(max_model_len=512)
    engine.add_request("x", SamplingParams(max_tokens=8, **params))
    assert engine.has_unfinished_requests()
