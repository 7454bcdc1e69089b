"""Two engine replicas (mock executor) behind Ray Serve on this machine, driven by the openai client:
64 concurrent requests, routing by queued tokens, a replica killed mid-run and replaced.

One Ray instance and one application serve the whole module (starting them takes most of its time);
the tests run in file order and the kill comes last.
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

ray = pytest.importorskip("ray", reason="replicas need Ray Serve: pip install 'hetero-core[ray]'")
pytest.importorskip("ray.serve", reason="replicas need Ray Serve: pip install 'hetero-core[ray]'")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from hetero_core.engine.requests.params import SamplingParams  # noqa: E402  (after the skips: these need Ray)
from hetero_core.replicas.frontend import REPLICA_HEADER  # noqa: E402  (after the skips: these need Ray)
from hetero_core.replicas.launcher import APP_NAME, deploy, stop  # noqa: E402  (after the skips: these need Ray)
from hetero_core.server.settings import load_server_settings  # noqa: E402  (after the skips: these need Ray)
from hetero_core.settings import load_settings  # noqa: E402  (after the skips: these need Ray)

# Every step with decodes sleeps 10 ms, so a request of N tokens takes at least N / 100 seconds.
MOCK = {"decode_latency_per_step": 0.01}
ENGINE = {"max_model_len": 16384, "max_num_blocks": 8192}
LONG_TOKENS = 12000  # at least 120 s: still running whatever this machine's speed when the test ends it
RUNNING_TOKENS = 1000  # at least 10 s: still running when the test kills their replica right after they start
MODEL = "mock-model"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def base_url():
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=80 * 1024 * 1024,
        log_to_driver=False,
        logging_level="WARNING",
    )
    try:
        settings = load_settings(executor={"name": "mock", "mock": MOCK}, **ENGINE)
        server = load_server_settings(
            replicas=2,
            replica_cpus=0.5,
            port=free_port(),
            served_model_name=MODEL,
            graceful_shutdown_seconds=1,
        )
        yield deploy(settings, server)
    finally:
        stop(started_ray=True)


def client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def replica_actor(replica_id: str):
    return ray.get_actor(f"SERVE_REPLICA::{APP_NAME}#EngineReplica#{replica_id}", namespace="serve")


def test_64_concurrent_requests_are_answered_by_both_replicas(base_url, make_mock_engine):
    prompts = [f"request {i} wants a story" for i in range(64)]
    max_tokens = [8 + i % 9 for i in range(64)]
    offline = make_mock_engine(MOCK)
    expected = [
        offline.generate([p], SamplingParams(max_tokens=m, seed=i))[0].text
        for i, (p, m) in enumerate(zip(prompts, max_tokens))
    ]

    async def one(api, i):
        raw = await api.completions.with_raw_response.create(
            model=MODEL, prompt=prompts[i], seed=i, max_tokens=max_tokens[i]
        )
        return raw.headers[REPLICA_HEADER], raw.parse()

    async def main():
        async with client(base_url) as api:
            return await asyncio.gather(*(one(api, i) for i in range(64)))

    results = asyncio.run(main())
    assert [r.choices[0].text for _, r in results] == expected  # the same tokens as one engine offline
    assert [r.usage.completion_tokens for _, r in results] == max_tokens
    per_replica = {replica: sum(1 for r, _ in results if r == replica) for replica, _ in results}
    assert len(per_replica) == 2 and min(per_replica.values()) >= 16, per_replica
    metrics = httpx.get(base_url + "/metrics").text
    for replica, count in per_replica.items():
        assert f'hetero_replica_requests_total{{replica="{replica}"}} {float(count)}' in metrics


def test_new_requests_go_to_the_replica_with_fewer_queued_tokens(base_url):
    async def main():
        async with client(base_url) as api:
            long = await api.completions.create(
                model=MODEL,
                prompt="a very long answer",
                max_tokens=LONG_TOKENS,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            busy = long.response.headers[REPLICA_HEADER]
            await anext(aiter(long))
            short = []
            for i in range(6):  # one after another: each sees the long request on `busy`
                raw = await api.completions.with_raw_response.create(
                    model=MODEL, prompt=f"short {i}", max_tokens=4
                )
                short.append(raw.headers[REPLICA_HEADER])
            await long.close()  # aborts the long request
            return busy, short

    busy, short = asyncio.run(main())
    assert busy not in short and len(set(short)) == 1, (busy, short)


def test_killing_a_replica_loses_only_the_requests_running_on_it_and_it_is_replaced(base_url):
    async def main():
        async with client(base_url) as api:
            streams, replicas = [], []
            # Until both replicas run at least two (a replica's report may still count the previous test's
            # long request for a second, and the router avoids it until then).
            while (
                len(streams) < 8
                or min(replicas.count(r) for r in set(replicas)) < 2
                or len(set(replicas)) < 2
            ):
                assert len(streams) < 40, replicas
                streams.append(
                    await api.completions.create(
                        model=MODEL,
                        prompt=f"running {len(streams)}",
                        max_tokens=RUNNING_TOKENS,
                        stream=True,
                        stream_options={"include_usage": True},
                        extra_body={"ignore_eos": True},
                    )
                )
                replicas.append(streams[-1].response.headers[REPLICA_HEADER])
            for s in streams:  # every request has produced text: it runs on its replica
                await anext(aiter(s))
            victim = replicas[0]
            ray.kill(replica_actor(victim), no_restart=True)
            after = [
                asyncio.ensure_future(api.completions.create(model=MODEL, prompt=f"after {i}", max_tokens=6))
                for i in range(16)
            ]  # sent while the frontend's router may not know of the death yet
            outcomes = await asyncio.gather(*(read_to_end(s) for s in streams))
            return victim, replicas, outcomes, await asyncio.gather(*after, return_exceptions=True)

    victim, replicas, outcomes, after = asyncio.run(main())
    assert victim in replicas and len(set(replicas)) == 2, replicas
    for replica, outcome in zip(replicas, outcomes):
        if replica == victim:  # reported: the stream ends with an error naming the replica
            assert isinstance(outcome, openai.APIError) and f"replica {victim} stopped" in str(outcome), (
                outcome
            )
        else:  # the other replica finishes the requests it was running
            assert outcome == RUNNING_TOKENS, outcome
    assert all(not isinstance(r, BaseException) and r.usage.completion_tokens == 6 for r in after), after
    metrics = httpx.get(base_url + "/metrics").text
    assert (
        f'hetero_replica_requests_lost_total{{replica="{victim}"}} {float(replicas.count(victim))}' in metrics
    )
    replacement = wait_for_replacement(base_url, {*replicas})
    assert replacement not in replicas


async def read_to_end(stream):
    """The stream's completion tokens (its usage chunk), or the error that ended it."""
    usage = None
    try:
        async for chunk in stream:
            usage = chunk.usage or usage
    except openai.APIError as exc:
        return exc
    return usage.completion_tokens if usage else None


def wait_for_replacement(base_url: str, known: set[str], timeout_s: float = 90) -> str:
    """A replica id that is not in ``known``, once one serves a request (bounded wait)."""
    api = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        raw = api.completions.with_raw_response.create(model=MODEL, prompt="who are you", max_tokens=2)
        replica = raw.headers[REPLICA_HEADER]
        if replica not in known:
            return replica
        time.sleep(0.5)
    raise AssertionError(f"no replica replaced the dead one within {timeout_s} s")
