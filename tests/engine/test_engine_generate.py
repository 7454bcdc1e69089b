"""Engine.generate / LLM.generate check every request before queueing any, and take prompts as LLM does."""

from __future__ import annotations

import pytest

from hetero_core import LLM
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.errors import ConfigError, InvalidRequestError


def assert_empty(engine):
    allocator = engine.scheduler.allocator
    assert not engine.has_unfinished_requests() and engine.state.seqs == {}
    assert allocator.num_free_blocks == allocator.num_blocks


def test_a_parameter_beyond_floats_fails_its_prompt_alone_and_leaves_no_orphan(make_mock_engine):
    engine = make_mock_engine()
    first, second = engine.generate(["a", "b"], [{"max_tokens": 3}, {"temperature": 10**400}])
    assert first.finish_reason == "length" and len(first.output_token_ids) == 3
    assert second.failed and "temperature must be a number within the float range" in second.error
    assert_empty(engine)


class FailingTokenizer:
    """The byte tokenizer, except that encoding ``poison`` raises an error that is not the request's."""

    def __init__(self, inner, poison):
        self.inner, self.poison = inner, poison

    def encode(self, text):
        if text == self.poison:
            raise ConfigError("the tokenizer's files went away")
        return self.inner.encode(text)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_an_error_while_checking_a_later_prompt_queues_none_of_them(make_mock_engine):
    engine = make_mock_engine()
    tokenizer = FailingTokenizer(engine.tokenizer, poison="b")
    if hasattr(engine, "processor"):
        engine.processor.tokenizer = tokenizer
    else:  # main before issue 23: the engine held the tokenizer itself
        engine.tokenizer = tokenizer
    with pytest.raises(ConfigError, match="went away"):
        engine.generate(["a", "b"], SamplingParams(max_tokens=50))
    assert_empty(engine)  # "a" was not queued: nothing runs on as an orphan
    assert engine.step() == []


@pytest.mark.parametrize(
    "prompt_dict, text", [({"prompt": "xy"}, "xy"), ({"prompt_token_ids": [120, 121]}, "xy")]
)
def test_engine_generate_takes_a_vllm_prompt_dict_as_one_prompt(make_mock_engine, prompt_dict, text):
    engine = make_mock_engine()
    [out] = engine.generate(prompt_dict, SamplingParams(max_tokens=2))
    assert out.prompt == text and out.prompt_token_ids == [120, 121] and not out.failed


@pytest.mark.parametrize("prompt_dict", [{"prompt": "x", "extra": 1}, {"text": "x"}, {}])
def test_any_other_dict_is_refused_never_iterated(make_mock_engine, prompt_dict):
    engine = make_mock_engine()
    [out] = engine.generate(prompt_dict, SamplingParams(max_tokens=2))
    assert out.failed and "vLLM prompt dict" in out.error
    with pytest.raises(InvalidRequestError, match="got dict with keys"):
        engine.add_request(prompt_dict)
    assert_empty(engine)


def test_engine_generate_takes_token_ids_as_one_prompt(make_mock_engine):
    engine = make_mock_engine()
    [out] = engine.generate([104, 105], SamplingParams(max_tokens=2))
    assert out.prompt == "hi" and not out.failed


def test_llm_generate_checks_every_prompt_before_queueing_any():
    with LLM(executor="mock") as llm:
        tokenizer = FailingTokenizer(llm.engine.tokenizer, poison="b")
        if hasattr(llm.engine, "processor"):
            llm.engine.processor.tokenizer = tokenizer
        else:
            llm.engine.tokenizer = tokenizer
        with pytest.raises(ConfigError):
            llm.generate(["a", "b"], SamplingParams(max_tokens=50))
        assert_empty(llm.engine)
        [ok] = llm.generate({"prompt": "a"}, SamplingParams(max_tokens=2))
        assert ok.prompt == "a" and len(ok.output_token_ids) == 2
