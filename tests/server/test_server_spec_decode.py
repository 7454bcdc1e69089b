"""The server with speculative decoding: same outputs, and /metrics carries vLLM's spec-decode counters."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hetero_core.engine.requests.params import SamplingParams


def scrape(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url + "/metrics").text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_completions_with_speculation_and_its_metrics(mock_server, make_mock_engine):
    prompt = "abc abc abc abc abc abc"
    expected = make_mock_engine().generate([prompt], SamplingParams(temperature=0, max_tokens=24))[0].text
    ngram = {
        "name": "ngram",
        "ngram": {"prompt_lookup_min": 1},
    }  # the mock's tokens are random: 1-grams recur
    server = mock_server(num_speculative_tokens=3, speculative_proposer=ngram)
    body = {"model": "test-model", "prompt": prompt, "max_tokens": 24, "temperature": 0}
    response = httpx.post(server.base_url + "/v1/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == expected
    metrics = scrape(server.base_url)
    stats = server.llm.stats
    assert metrics["hetero_spec_decode_num_draft_tokens_total"] == stats.spec_num_draft_tokens > 0
    assert metrics["hetero_spec_decode_num_accepted_tokens_total"] == stats.spec_num_accepted_tokens
    assert metrics["hetero_spec_decode_num_drafts_total"] == stats.spec_num_drafts > 0
