"""vLLM's sampling extras (``extra_body``) and OpenAI's ``logit_bias`` / ``best_of`` through the live server
with the openai client: each reaches the engine's SamplingParams and changes the answer, or is a 400
that names it. The mock's tokens are turned into logits (``LogitsExecutor``) so the sampler's token
constraints have logits to act on; the expected answers come from the engine offline."""

from __future__ import annotations

import openai
import pytest

from hetero_core.default_plugins.byte_tokenizer import BOS_TOKEN_ID
from hetero_core.engine.requests.params import SamplingParams
from tests.server.live_server import LiveServer

torch = pytest.importorskip("torch")
from tests.logits_executor import LogitsExecutor  # noqa: E402  (after the torch check)

PROMPT = "x" * 40  # byte tokenizer: one token per byte


@pytest.fixture
def logits_engine(make_mock_engine):
    def make(mock_options=None):
        engine = make_mock_engine(mock_options)
        engine.executor = LogitsExecutor(engine.executor, engine.tokenizer.vocab_size)
        return engine

    return make


@pytest.fixture
def server(logits_engine):
    started = []

    def start(mock_options=None):
        started.append(LiveServer(logits_engine(mock_options)).__enter__())
        return started[-1]

    yield start
    for live in started:
        live.__exit__(None, None, None)


def offline(make_engine, prompt=PROMPT, mock_options=None, **params):
    [out] = make_engine(mock_options).generate([prompt], SamplingParams(**params))
    return out


def _printable(text):
    return next(c for c in text if c.isalnum())


@pytest.mark.parametrize(
    "make_extras",
    [
        lambda plain: {"allowed_token_ids": [97, 98]},
        lambda plain: {"bad_words": [_printable(plain.text)]},
        lambda plain: {"logit_bias": {"65": 100}},
        lambda plain: {"min_tokens": 5},
    ],
    ids=["allowed_token_ids", "bad_words", "logit_bias", "min_tokens"],
)
def test_token_extras_shape_completions_and_chat_as_offline(server, logits_engine, make_extras, request):
    options = {"eos_after": 2} if "min_tokens" in request.node.callspec.id else None
    client = server(options).client()
    params = {"temperature": 0, "max_tokens": 8}
    plain = offline(logits_engine, mock_options=options, **params)
    extras = make_extras(plain)
    expected = offline(logits_engine, mock_options=options, **params, **extras)
    assert expected.output_token_ids != plain.output_token_ids  # the extra changes the answer
    got = client.completions.create(
        model="test-model", prompt=PROMPT, max_tokens=8, temperature=0, extra_body=extras
    )
    assert got.choices[0].text == expected.text
    assert got.usage.completion_tokens == len(expected.output_token_ids)
    chat = client.chat.completions.create(
        model="test-model",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=8,
        temperature=0,
        extra_body=extras,
    )
    if "allowed_token_ids" in extras:
        assert set(chat.choices[0].message.content) <= {"a", "b"}
    if "min_tokens" in extras:
        assert chat.usage.completion_tokens >= 5


def test_logit_bias_is_the_openai_clients_own_argument(server, logits_engine):
    got = (
        server()
        .client()
        .completions.create(
            model="test-model", prompt=PROMPT, max_tokens=6, temperature=0, logit_bias={"66": 100}
        )
    )
    assert got.choices[0].text == "B" * 6


def test_stop_string_kept_and_special_tokens_shown_when_asked(server, logits_engine):
    client = server({"eos_after": 3}).client()
    plain = offline(logits_engine, mock_options={"eos_after": 3}, temperature=0, max_tokens=8)
    stop = plain.text[1]
    got = client.completions.create(
        model="test-model",
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        stop=[stop],
        extra_body={"include_stop_str_in_output": True},
    )
    assert got.choices[0].text == plain.text[:2] and got.choices[0].text.endswith(stop)
    bos = {"logit_bias": {str(BOS_TOKEN_ID): 100}, "max_tokens": 2}  # BOS mid-text: a special token shown
    hidden = client.completions.create(model="test-model", prompt=PROMPT, temperature=0, extra_body=bos)
    shown = client.completions.create(
        model="test-model", prompt=PROMPT, temperature=0, extra_body={**bos, "skip_special_tokens": False}
    )
    tight = client.completions.create(
        model="test-model",
        prompt=PROMPT,
        temperature=0,
        extra_body={**bos, "skip_special_tokens": False, "spaces_between_special_tokens": False},
    )
    assert hidden.choices[0].text == "" and tight.choices[0].text == "<s><s>"
    assert shown.choices[0].text.split(" ") == ["", "<s>", "<s>"]  # spaced, after the prompt too


def test_stop_token_ids_end_the_answer(server, logits_engine):
    plain = offline(logits_engine, temperature=0, max_tokens=8)
    got = (
        server()
        .client()
        .completions.create(
            model="test-model",
            prompt=PROMPT,
            max_tokens=8,
            temperature=0,
            extra_body={"stop_token_ids": [plain.output_token_ids[2]]},
        )
    )
    assert got.choices[0].text == plain.text[:2] and got.choices[0].finish_reason == "stop"


def test_a_stop_token_id_beyond_the_vocabulary_with_min_tokens_fails_nobody(server, logits_engine):
    client = server().client()
    plain = offline(logits_engine, temperature=0, max_tokens=4)
    got = client.completions.create(
        model="test-model",
        prompt=PROMPT,
        max_tokens=4,
        temperature=0,
        extra_body={"stop_token_ids": [10**30], "min_tokens": 2},
    )
    assert got.choices[0].text == plain.text


def test_best_of_returns_the_n_candidates_of_best_cumulative_logprob(server, logits_engine):
    params = dict(temperature=1.0, max_tokens=5, seed=3)
    singles = [offline(logits_engine, **{**params, "seed": 3 + i}, logprobs=0) for i in range(4)]
    best = sorted(singles, key=lambda s: s.outputs[0].cumulative_logprob, reverse=True)[:2]
    got = server().client().completions.create(model="test-model", prompt=PROMPT, n=2, best_of=4, **params)
    assert [c.text for c in got.choices] == [s.text for s in best]
    assert all(c.logprobs is None for c in got.choices)  # drawn to rank, not asked for
    assert got.usage.completion_tokens == sum(len(s.output_token_ids) for s in singles)  # every candidate


@pytest.mark.parametrize(
    "kwargs, param, message",
    [
        ({"n": 2, "best_of": 1}, "best_of", "at least n"),
        ({"best_of": 2, "stream": True}, "best_of", "cannot be streamed"),
        ({"extra_body": {"min_tokens": 20}}, None, "min_tokens (20) must be at most max_tokens (5)"),
        ({"logit_bias": {"sixty": 1}}, None, "logit_bias must be a dict of token id"),
        ({"logit_bias": {"65": 101}}, None, "logit_bias values must be in [-100, 100]"),
        (
            {"logit_bias": {"\u00b2": 1}},
            None,
            "logit_bias must be a dict of token id",
        ),  # "2".isdigit(), not int
        (
            {"logit_bias": {"9" * 5000: 1}},
            None,
            "logit_bias must be a dict of token id",
        ),  # beyond int()'s limit
        ({"extra_body": {"allowed_token_ids": [10**6]}}, None, "outside the vocabulary"),
        ({"extra_body": {"allowed_token_ids": []}}, "allowed_token_ids", "allowed_token_ids"),
        ({"extra_body": {"bad_words": "no"}}, "bad_words", "bad_words"),
        ({"extra_body": {"prompt_logprobs": 1}}, None, "prompt_logprobs is not supported"),
        ({"extra_body": {"skip_special_tokens": "no"}}, "skip_special_tokens", "skip_special_tokens"),
    ],
)
def test_bad_extras_are_a_400_that_names_them(server, kwargs, param, message):
    with pytest.raises(openai.BadRequestError) as caught:
        server().client().completions.create(model="test-model", prompt=PROMPT, max_tokens=5, **kwargs)
    error = caught.value.body
    assert message in error["message"]
    if param is not None:
        assert error["param"] == param


def test_chat_template_extras_reach_the_template(server):
    client = server().client()
    messages = [{"role": "user", "content": "hi"}]
    with_prompt = client.chat.completions.create(model="test-model", messages=messages, max_tokens=1)
    without = client.chat.completions.create(
        model="test-model", messages=messages, max_tokens=1, extra_body={"add_generation_prompt": False}
    )
    # the byte tokenizer's template ends with "assistant: " unless add_generation_prompt is false
    assert with_prompt.usage.prompt_tokens - without.usage.prompt_tokens == len("assistant: ")
    with pytest.raises(openai.BadRequestError) as caught:  # the byte tokenizer has no template variables
        client.chat.completions.create(
            model="test-model",
            messages=messages,
            max_tokens=1,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
    assert "takes no chat option chat_template_kwargs" in caught.value.body["message"]
