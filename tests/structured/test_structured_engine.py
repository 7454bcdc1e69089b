"""Guided decoding end to end through the engine: every output parses and matches its schema, on the
mock executor (which honours the batch's token bitmask) and on the embedded SmolLM2 (the sampler
masks its logits)."""

from __future__ import annotations

import json
import re

import pytest

from hetero_core import LLM, InvalidRequestError, SamplingParams
from hetero_core.structured_output import GuidedDecodingParams
from hetero_core.testing.structured_output_cases import CHOICES, REGEXES, SCHEMAS, schema_problems

pytest.importorskip("xgrammar", reason="structured output needs: pip install 'hetero-core[structured]'")
jsonschema = pytest.importorskip("jsonschema")


def check_json(text: str, schema: dict) -> None:
    value = json.loads(text)
    assert not schema_problems(value, schema), (schema_problems(value, schema), text)
    jsonschema.validate(value, schema)


def test_every_schema_on_the_mock_batched(make_mock_engine):
    engine = make_mock_engine(max_model_len=4096)
    names = list(SCHEMAS)
    prompts = [f"{name} {seed}" for name in names for seed in range(4)]
    params = [
        SamplingParams(max_tokens=3000, seed=i, guided_decoding=GuidedDecodingParams(json=SCHEMAS[name]))
        for i, name in enumerate(n for n in names for _ in range(4))
    ]
    free = ["free text", "more free text"]  # unconstrained requests share the steps
    outputs = engine.generate(prompts + free, params + [SamplingParams(max_tokens=20)] * 2)
    for out, prompt in zip(outputs, prompts):
        assert out.error is None and out.finish_reason == "eos", (prompt, out.error)
        check_json(out.text, SCHEMAS[prompt.rsplit(" ", 1)[0]])
    alone = make_mock_engine().generate(free, SamplingParams(max_tokens=20))
    assert [o.text for o in outputs[-2:]] == [o.text for o in alone]  # constrained neighbours change nothing


def test_regex_choice_and_json_object_on_the_mock(make_mock_engine):
    engine = make_mock_engine(max_model_len=4096)
    for name, pattern in REGEXES.items():
        [out] = engine.generate(["r"], SamplingParams(max_tokens=200, guided_decoding={"regex": pattern}))
        assert re.fullmatch(pattern, out.text), (name, out.text)
    for choices in CHOICES.values():
        [out] = engine.generate(["c"], SamplingParams(guided_decoding={"choice": choices}))
        assert out.text in choices
    [out] = engine.generate(["o"], SamplingParams(max_tokens=3000, guided_decoding={"json_object": True}))
    assert isinstance(json.loads(out.text), dict)


def test_the_same_request_gives_the_same_output(make_mock_engine):
    params = SamplingParams(max_tokens=2000, guided_decoding={"json": SCHEMAS["arrays"]})
    first = make_mock_engine().generate(["x"], params)[0].text
    assert make_mock_engine(max_batch_size=1).generate(["x", "y"], params)[0].text == first


def test_a_bad_schema_fails_alone_with_a_message(make_mock_engine):
    engine = make_mock_engine()
    with pytest.raises(InvalidRequestError, match="guided regex could not be compiled"):
        engine.add_request("x", SamplingParams(guided_decoding={"regex": "(unclosed"}))
    outs = engine.generate(
        ["bad", "good"], [SamplingParams(guided_decoding={"regex": "(x"}), SamplingParams(max_tokens=3)]
    )
    assert "could not be compiled" in outs[0].error and outs[1].error is None


def test_an_executor_that_ignores_the_mask_fails_the_request(make_mock_engine):
    engine = make_mock_engine()
    real = engine.executor.execute
    engine.executor.execute = lambda batch: real(__import__("dataclasses").replace(batch, token_bitmask=None))
    [out] = engine.generate(["x"], SamplingParams(guided_decoding={"choice": ["yes", "no"]}))
    assert "not allowed by the request's guided decoding" in out.error


@pytest.mark.slow
def test_every_schema_on_smollm2(smollm2_dir):
    llm = LLM(model=str(smollm2_dir), executor="torch", max_model_len=1024)
    prompts, params = [], []
    for name, schema in SCHEMAS.items():
        messages = [
            {"role": "user", "content": f"Give an example of {name} as JSON matching {json.dumps(schema)}"}
        ]
        prompts.append(messages)
        params.append(
            SamplingParams(temperature=0, max_tokens=400, guided_decoding=GuidedDecodingParams(json=schema))
        )
    prompts.append([{"role": "user", "content": "Is the sky blue?"}])
    params.append(SamplingParams(temperature=0, guided_decoding={"choice": ["yes", "no"]}))
    outputs = llm.engine.generate(prompts, params)
    for out, name in zip(outputs, list(SCHEMAS) + ["choice"]):
        assert out.error is None and out.finish_reason in ("eos", "stop"), (name, out.finish_reason, out.text)
        if name == "choice":
            assert out.text in ("yes", "no")
        else:
            check_json(out.text, SCHEMAS[name])


def test_once_constrained_requests_end_or_abort_steps_carry_no_bitmask(make_mock_engine):
    engine = make_mock_engine()
    seen = []
    real = engine.executor.execute
    engine.executor.execute = lambda batch: seen.append(batch.token_bitmask is not None) or real(batch)
    engine.generate(["x"], SamplingParams(max_tokens=50, guided_decoding={"regex": "[a-z]{1,5}"}))
    aborted = engine.add_request("y", SamplingParams(max_tokens=50, guided_decoding={"regex": "[a-z]{40}"}))
    engine.step()
    assert engine.abort(aborted)
    seen.clear()
    engine.generate(["plain"], SamplingParams(max_tokens=3))
    assert seen and not any(seen)


def test_vllm_backend_and_whitespace_pattern_do_what_they_say(make_mock_engine):
    engine = make_mock_engine()
    for backend in (None, "auto", "xgrammar", "xgrammar:disable-any-whitespace"):
        guided = GuidedDecodingParams(choice=["yes", "no"], backend=backend)
        [out] = engine.generate(["x"], SamplingParams(max_tokens=5, guided_decoding=guided))
        assert out.text in ("yes", "no"), backend
    refused = [
        ("outlines", "backend 'outlines' is not this engine's: it uses 'xgrammar'"),
        (None, "whitespace_pattern is not supported by xgrammar"),
    ]
    for backend, message in refused:
        guided = GuidedDecodingParams(
            json={"type": "object"}, backend=backend, whitespace_pattern=None if backend else r"[ ]?"
        )
        [out] = engine.generate(["x"], SamplingParams(max_tokens=5, guided_decoding=guided))
        assert message in out.error
