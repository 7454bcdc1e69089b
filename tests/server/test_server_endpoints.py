"""vLLM's extra endpoints and OpenAI's model retrieval: /v1/models/{id}, /tokenize, /detokenize, /version."""

from __future__ import annotations

import httpx
import openai
import pytest

import hetero_core


def test_retrieve_the_served_model_and_404_for_others(mock_server):
    server = mock_server()
    client = server.client()
    assert client.models.retrieve("test-model").id == "test-model"
    with pytest.raises(openai.NotFoundError, match="model 'gpt-4' does not exist; available: test-model"):
        client.models.retrieve("gpt-4")


def test_tokenize_and_detokenize_round_trip(mock_server):
    server = mock_server()
    base = server.base_url
    result = httpx.post(base + "/tokenize", json={"prompt": "héllo"}, timeout=30).json()
    assert result["tokens"] == list("héllo".encode()) and result["count"] == 6 and result["max_model_len"] > 0
    chat = httpx.post(
        base + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=30
    ).json()
    assert chat["tokens"] == list(b"user: hi\nassistant: ")
    assert httpx.post(base + "/detokenize", json={"tokens": result["tokens"]}, timeout=30).json() == {
        "prompt": "héllo"
    }


@pytest.mark.parametrize("path, body, message", [
    ("/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "x"}]},
     "exactly one of prompt or messages"),
    ("/tokenize", {"prompt": "x", "model": "other"}, "does not exist"),
    ("/detokenize", {"tokens": [99999]}, "token id"),
])  # fmt: skip
def test_bad_token_requests_say_why(mock_server, path, body, message):
    response = httpx.post(mock_server().base_url + path, json=body, timeout=30)
    assert response.status_code in (400, 404) and message in response.json()["error"]["message"]


def test_version(mock_server):
    assert httpx.get(mock_server().base_url + "/version", timeout=30).json() == {
        "version": hetero_core.__version__
    }
