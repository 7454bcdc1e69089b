"""On the embedded SmolLM2's real tokenizer and sampler: guided output whose ``allowed_token_ids`` leave its
grammar no first token is a 400 from ``hetero serve`` (and an error from the python API) naming the
fields, before any step; ``min_tokens`` beyond what the grammar can take is served, the grammar ending the
answer with EOS."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("xgrammar", reason="structured output needs: pip install 'hetero-core[structured]'")

from hetero_core import InvalidRequestError, SamplingParams  # noqa: E402
from hetero_core.builder import build_engine  # noqa: E402
from hetero_core.plugin_system.discovery import load_plugins  # noqa: E402
from hetero_core.settings import load_settings  # noqa: E402
from tests.server.live_server import LiveServer  # noqa: E402

YES_NO = ["yes", "no"]
OBJECT = {"type": "object"}


@pytest.fixture(scope="module")
def server(smollm2_dir):
    settings = load_settings(model=str(smollm2_dir), executor="torch", max_num_blocks=128)
    engine = build_engine(settings, load_plugins(entry_points=[]))
    steps = []
    real = engine.executor.execute
    engine.executor.execute = lambda batch: steps.append(batch) or real(batch)
    with LiveServer(engine, model_name="smollm2") as live:
        live.steps = steps
        yield live


def maybe(server) -> list[int]:
    return server.llm.engine.tokenizer.encode(" maybe")


def test_allowed_tokens_the_grammar_cannot_start_with_are_a_400_before_any_step(server):
    before = len(server.steps)
    body = {"prompt": "Is the sky blue?", "max_tokens": 4, "guided_choice": YES_NO}
    response = httpx.post(
        server.base_url + "/v1/completions", json={**body, "allowed_token_ids": maybe(server)}, timeout=60
    )
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "allowed_token_ids" in message and "guided_choice" in message and "executor" not in message
    chat = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Describe a cat as JSON."}],
        "max_tokens": 4,
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": OBJECT}},
        "allowed_token_ids": maybe(server),
    }
    response = httpx.post(server.base_url + "/v1/chat/completions", json=chat, timeout=60)
    assert response.status_code == 400, response.text
    assert "response_format json_schema" in response.json()["error"]["message"]
    assert len(server.steps) == before  # refused before any engine work


def test_the_request_processor_behind_llm_generate_refuses_it_too(server):
    engine = server.llm.engine
    with pytest.raises(InvalidRequestError, match="allowed_token_ids"):
        engine.processor.process(
            "Is the sky blue?",
            SamplingParams(guided_decoding={"choice": YES_NO}, allowed_token_ids=maybe(server)),
        )


def test_allowed_tokens_that_spell_a_choice_are_served(server):
    yes = server.llm.engine.tokenizer.encode("yes")
    answer = server.client().completions.create(
        model="smollm2",
        prompt="Is the sky blue?",
        max_tokens=8,
        temperature=0,
        extra_body={"guided_choice": YES_NO, "allowed_token_ids": yes},
    )
    assert answer.choices[0].text == "yes" and answer.choices[0].finish_reason == "stop"


def test_min_tokens_beyond_the_grammar_is_served_and_the_grammar_ends_it(server):
    answer = server.client().completions.create(
        model="smollm2",
        prompt="Is the sky blue?",
        max_tokens=40,
        temperature=0,
        extra_body={"guided_choice": YES_NO, "min_tokens": 20},
    )
    [choice] = answer.choices
    assert choice.text in YES_NO and choice.finish_reason == "stop"
    assert answer.usage.completion_tokens < 20
