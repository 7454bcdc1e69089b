"""The server's ``n``: a prompt's choices after its first share the prompt's KV blocks (prefix cache)."""

from __future__ import annotations

PROMPT = "y" * 40  # byte tokenizer: two full blocks of 16 and a partial one


def test_n_choices_share_the_prompt(mock_server, make_mock_engine):
    server = mock_server()
    client = server.client()
    result = client.completions.create(model="test-model", prompt=PROMPT, max_tokens=4, n=3, temperature=0)
    assert len({c.text for c in result.choices}) == 1  # unseeded mock: equal answers
    assert server.llm.engine.stats().prefix_cache_hit_tokens == 2 * 32  # choices 1 and 2 found the prompt
