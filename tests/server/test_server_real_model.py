"""The server on the real embedded SmolLM2: greedy output equals the engine's offline output."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from hetero_core.builder import build_engine  # noqa: E402
from hetero_core.engine.requests.params import SamplingParams  # noqa: E402
from hetero_core.plugin_system.discovery import load_plugins  # noqa: E402
from hetero_core.settings import load_settings  # noqa: E402
from tests.server.live_server import LiveServer  # noqa: E402

pytestmark = pytest.mark.slow
PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,"]
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
MAX_TOKENS = 12


def make_engine(smollm2_dir):
    settings = load_settings(model=str(smollm2_dir), executor="torch", max_num_blocks=256)
    return build_engine(settings, load_plugins(entry_points=[]))


@pytest.fixture(scope="module")
def offline(smollm2_dir):
    engine = make_engine(smollm2_dir)
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    outputs = engine.generate(PROMPTS + [MESSAGES], greedy)
    engine.shutdown()
    return outputs


@pytest.fixture(scope="module")
def server(smollm2_dir):
    with LiveServer(make_engine(smollm2_dir), model_name="smollm2") as live:
        yield live


def test_greedy_completions_equal_the_offline_engine(server, offline):
    client = server.client()
    result = client.completions.create(model="smollm2", prompt=PROMPTS, max_tokens=MAX_TOKENS, temperature=0)
    assert [c.text for c in result.choices] == [o.text for o in offline[:3]]
    assert result.usage.prompt_tokens == sum(len(o.prompt_token_ids) for o in offline[:3])
    assert result.usage.completion_tokens == sum(len(o.output_token_ids) for o in offline[:3])


def test_greedy_chat_streams_the_offline_text(server, offline):
    stream = server.client().chat.completions.create(
        model="smollm2", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == offline[3].text
    assert "Paris" in text


def test_logprobs_are_real_log_probabilities(server):
    client = server.client()
    result = client.completions.create(
        model="smollm2", prompt=PROMPTS[0], max_tokens=4, temperature=0, logprobs=3
    )
    lp = result.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == result.choices[0].text
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0 and len(top) == 3
        assert math.isclose(chosen, max(top.values()), abs_tol=1e-4)  # greedy picks the most likely

    chat = client.chat.completions.create(
        model="smollm2", messages=MESSAGES, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


def test_prompt_logprobs_come_back_in_the_choice_as_vllm_sends_them(server, smollm2_dir):
    settings = load_settings(model=str(smollm2_dir), executor="torch", dtype="float32")
    engine = build_engine(settings, load_plugins(entry_points=[]))
    [offline_out] = engine.generate(
        PROMPTS[:1], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2)
    )
    engine.shutdown()
    client = server.client()
    result = client.completions.create(
        model="smollm2", prompt=PROMPTS[0], max_tokens=2, temperature=0, extra_body={"prompt_logprobs": 2}
    )
    entries = result.choices[0].model_extra["prompt_logprobs"]
    ids = offline_out.prompt_token_ids
    assert len(entries) == len(ids) and entries[0] is None
    for entry, token_id, want in zip(entries[1:], ids[1:], offline_out.prompt_logprobs[1:]):
        assert str(token_id) in entry and len(entry) in (2, 3)
        # the server's engine runs the auto dtype (bf16 where the CPU has it): close to fp32, not equal
        assert math.isclose(entry[str(token_id)]["logprob"], want[token_id].logprob, abs_tol=0.25)
        assert entry[str(token_id)]["decoded_token"] == want[token_id].decoded_token
        ranks = sorted(v["rank"] for v in entry.values() if v["rank"] <= 2)
        assert ranks == [1, 2]
    stream = client.completions.create(
        model="smollm2",
        prompt=PROMPTS[0],
        max_tokens=2,
        temperature=0,
        stream=True,
        extra_body={"prompt_logprobs": 0},
    )
    sent = [c.choices[0].model_extra.get("prompt_logprobs") for c in stream if c.choices]
    assert sent[0] is not None and [list(e) for e in sent[0][1:]] == [[str(t)] for t in ids[1:]]
    assert all(s is None for s in sent[1:])
    plain = client.completions.create(model="smollm2", prompt=PROMPTS[0], max_tokens=2, temperature=0)
    assert plain.choices[0].model_extra.get("prompt_logprobs") is None


def test_chat_returns_prompt_logprobs_at_the_top_as_vllm_does(server):
    result = server.client().chat.completions.create(
        model="smollm2", messages=MESSAGES, max_tokens=2, temperature=0, extra_body={"prompt_logprobs": 1}
    )
    entries = result.model_extra["prompt_logprobs"]
    assert entries[0] is None and len(entries) == result.usage.prompt_tokens
    assert all(1 <= len(entry) <= 2 and min(v["rank"] for v in entry.values()) == 1 for entry in entries[1:])
