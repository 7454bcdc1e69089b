"""Concurrent clients batch together, a disconnect frees its blocks, overload gets 429, /metrics tells."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hetero_core.engine.requests.params import SamplingParams

LATENCY = {"decode_latency_per_step": 0.002, "prefill_latency_per_token": 0.0001}


def scrape(base_url: str) -> dict[str, float]:
    samples = {}
    for family in text_string_to_metric_families(httpx.get(base_url + "/metrics").text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return samples


def test_32_concurrent_streaming_clients_get_complete_outputs_in_shared_steps(mock_server, make_mock_engine):
    server = mock_server(LATENCY)
    prompts = [f"client {i} says hello" for i in range(32)]
    params = [SamplingParams(max_tokens=16 + i % 8, seed=i) for i in range(32)]
    offline = make_mock_engine(LATENCY)
    expected = [offline.generate([p], sp)[0].text for p, sp in zip(prompts, params)]

    async def one(client, i):
        stream = await client.completions.create(
            model="test-model",
            prompt=prompts[i],
            seed=i,
            max_tokens=params[i].max_tokens,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for chunk in stream:
            text += "".join(c.text for c in chunk.choices)
            usage = chunk.usage or usage
        return text, usage

    async def main():
        async with server.async_client() as client:
            return await asyncio.gather(*(one(client, i) for i in range(32)))

    results = asyncio.run(main())
    assert [text for text, _ in results] == expected
    assert [u.completion_tokens for _, u in results] == [p.max_tokens for p in params]
    metrics = scrape(server.base_url)
    assert metrics["hetero_step_batch_size_max"] > 1
    assert server.llm.stats.max_step_batch_size > 1
    assert metrics["hetero_requests_finished_total{finish_reason=length}"] == 32
    assert metrics["hetero_generation_tokens_total"] == sum(p.max_tokens for p in params)
    assert metrics["hetero_prompt_tokens_total"] == sum(len(p.encode()) for p in prompts)
    assert metrics["hetero_time_to_first_token_seconds_count"] == 32
    assert metrics["hetero_e2e_request_latency_seconds_count"] == 32
    assert metrics["hetero_inter_token_latency_seconds_count"] == sum(p.max_tokens - 1 for p in params)
    assert metrics["hetero_kv_blocks_total"] == 1024


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/completions", {"prompt": "never mind", "max_tokens": 1000, "stream": True}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1000, "stream": True},
        ),
    ],
)
def test_client_disconnect_mid_stream_aborts_and_frees_blocks(mock_server, path, body):
    server = mock_server({"decode_latency_per_step": 0.01})
    with httpx.stream("POST", server.base_url + path, json=body, timeout=30) as response:
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["choices"]
        deadline = time.monotonic() + 30  # stats are published after each loop pass
        while server.llm.stats.num_running != 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert server.llm.stats.num_running == 1 and server.llm.stats.num_free_blocks < 1024
    # the connection is closed: the server notices, aborts the request and frees its blocks
    assert server.wait_until_idle()
    metrics = scrape(server.base_url)
    assert metrics["hetero_kv_blocks_used"] == 0
    assert metrics["hetero_requests_finished_total{finish_reason=abort}"] == 1
    assert server.llm.stats.num_steps < 1000


def test_non_streaming_client_that_times_out_is_aborted(mock_server):
    server = mock_server({"decode_latency_per_step": 0.01})
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.base_url + "/v1/completions", json={"prompt": "slow", "max_tokens": 1000}, timeout=0.3
        )
    assert server.wait_until_idle()
    assert server.llm.stats.num_steps < 1000


def test_beyond_the_pending_limit_clients_get_429_and_the_others_finish(mock_server):
    server = mock_server({"decode_latency_per_step": 0.01}, max_pending_requests=2)
    client = server.async_client()

    async def main():
        slow = [
            asyncio.create_task(client.completions.create(model="test-model", prompt=f"s{i}", max_tokens=40))
            for i in range(2)
        ]
        deadline = time.monotonic() + 30
        while server.llm.stats.num_pending < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        with pytest.raises(openai.RateLimitError) as info:
            await client.completions.create(model="test-model", prompt="one too many", max_tokens=1)
        assert "max_pending_requests" in info.value.body["message"]
        return await asyncio.gather(*slow)

    done = asyncio.run(main())
    assert [r.usage.completion_tokens for r in done] == [40, 40]


def test_shutdown_lets_short_requests_finish_and_reports_long_ones_aborted(make_mock_engine):
    from tests.server.live_server import LiveServer

    server = LiveServer(make_mock_engine({"decode_latency_per_step": 0.01}), drain_seconds=0.5).__enter__()
    url = server.base_url + "/v1/completions"
    with (
        httpx.stream(
            "POST", url, json={"prompt": "short", "max_tokens": 20, "stream": True}, timeout=30
        ) as short,
        httpx.stream(
            "POST", url, json={"prompt": "long", "max_tokens": 1500, "stream": True}, timeout=30
        ) as long,
    ):
        short_lines, long_lines = short.iter_lines(), long.iter_lines()
        next(line for line in short_lines if line.startswith("data: "))
        next(line for line in long_lines if line.startswith("data: "))
        server.__exit__(None, None, None)  # drain for 0.5 s, then abort what still runs
        short_events = [line[6:] for line in short_lines if line.startswith("data: ")]
        long_events = [line[6:] for line in long_lines if line.startswith("data: ")]
    assert (
        short_events[-1] == "[DONE]"
        and json.loads(short_events[-2])["choices"][0]["finish_reason"] == "length"
    )
    assert long_events[-1] == "[DONE]"
    assert json.loads(long_events[-2])["error"]["code"] == "engine_unavailable"
    assert not server.llm.is_running
