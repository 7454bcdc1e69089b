"""GuidedDecodingParams (vLLM's shape) and SamplingParams(guided_decoding=...): validated once, hashable."""

from __future__ import annotations

import pytest

from hetero_core import InvalidRequestError, SamplingParams
from hetero_core.structured_output import GuidedDecodingParams


def test_exactly_one_kind():
    with pytest.raises(
        InvalidRequestError, match="exactly one of json, json_object, regex, choice, grammar; got none"
    ):
        GuidedDecodingParams()
    with pytest.raises(InvalidRequestError, match="got json, regex"):
        GuidedDecodingParams(json={"type": "string"}, regex="a")


def test_schema_is_compact_text_so_params_hash_and_compare():
    a = GuidedDecodingParams(json={"b": 1, "a": {"type": "string"}})
    b = GuidedDecodingParams(json='{"b": 1,  "a": {"type": "string"}}')
    assert a == b and hash(a) == hash(b) and a.kind == "json"
    assert a.json == '{"b":1,"a":{"type":"string"}}'  # key order kept: properties are generated in that order
    assert GuidedDecodingParams(choice=["x", "y"]).choice == ("x", "y")


@pytest.mark.parametrize("kwargs, message", [
    ({"json": "{not json"}, "guided json is not valid JSON"),
    ({"json": [1]}, "must be a JSON schema object"),
    ({"choice": []}, "non-empty list"),
    ({"choice": ["a", 1]}, "non-empty list of non-empty strings"),
    ({"regex": ""}, "guided regex must be a non-empty string"),
    ({"json_object": "yes"}, "guided json_object must be true or false"),
])  # fmt: skip
def test_bad_values_name_the_field(kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        GuidedDecodingParams(**kwargs)


def test_sampling_params_take_the_params_or_a_dict():
    params = SamplingParams(guided_decoding={"choice": ["yes", "no"]})
    assert params.guided_decoding == GuidedDecodingParams(choice=("yes", "no"))
    assert SamplingParams.from_dict({"guided_decoding": {"regex": "a+"}}).guided_decoding.regex == "a+"
    with pytest.raises(
        InvalidRequestError, match="unknown guided decoding field 'jsn'|unknown guided decoding field jsn"
    ):
        SamplingParams(guided_decoding={"jsn": {}})
    with pytest.raises(InvalidRequestError, match="guided_decoding must be a GuidedDecodingParams or a dict"):
        SamplingParams(guided_decoding="json")
    hash(params)


def test_without_xgrammar_a_guided_request_gets_one_line_saying_what_to_install(
    make_mock_engine, monkeypatch
):
    from hetero_core.default_plugins import xgrammar_backend

    monkeypatch.setattr(xgrammar_backend.importlib.util, "find_spec", lambda name, *a: None)
    engine = make_mock_engine()
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request("x", SamplingParams(guided_decoding={"choice": ["a", "b"]}))
    assert str(info.value) == (
        "structured output is unavailable: xgrammar (core's structured-output backend) is "
        "not installed; run: pip install 'hetero-core[structured]'"
    )
    [out] = engine.generate(["plain"], SamplingParams(max_tokens=3))  # everything else works
    assert out.error is None
