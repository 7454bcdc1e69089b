"""Prefill/decode disaggregation behind one OpenAI front end: the pair answers as one engine does (the
real ``openai`` client, streamed and not), and a killed role fails only the requests it was serving,
with a 5xx naming it, while /health reports it; nothing hangs."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from tests.server.disagg_roles import FrontEnd, Role

MOCK = ["--executor", "mock", "--block-size", "4", "--log-level", "warning"]
PROMPTS = ["hello there", "a longer prompt that spans several blocks of four tokens", "x"]


@pytest.fixture
def roles():
    started = []

    def start(env=None, flags=MOCK):
        pair = [Role("prefill", flags, env), Role("decode", flags, env)]
        started.extend(pair)
        for role in pair:
            role.wait_ready()
        return pair

    yield start
    for role in started:
        if role.process.poll() is None:
            role.kill()


def test_the_pair_answers_as_one_engine(roles, mock_server):
    single = mock_server(block_size=4)
    prefill, decode = roles()
    with FrontEnd(prefill.url, decode.url) as front:
        pair_client, one_client = front.openai(), single.client()
        for prompt in PROMPTS:
            kwargs = dict(prompt=prompt, max_tokens=9, temperature=0)
            want = one_client.completions.create(model="test-model", **kwargs).choices[0]
            got = pair_client.completions.create(model="m", **kwargs).choices[0]
            assert (got.text, got.finish_reason) == (want.text, want.finish_reason)
            streamed = "".join(
                c.choices[0].text for c in pair_client.completions.create(model="m", stream=True, **kwargs)
            )
            assert streamed == want.text
        chat = dict(messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0)
        assert (
            pair_client.chat.completions.create(model="m", **chat).choices[0].message.content
            == one_client.chat.completions.create(model="test-model", **chat).choices[0].message.content
        )
        raw = httpx.post(front.base_url + "/v1/completions", json=dict(model="m", prompt="hi", max_tokens=2))
        prefill_s, transfer_s = (
            float(p.split("=")[1]) for p in raw.headers["x-hetero-kv-transfer"].split(";")
        )
        assert prefill_s >= 0 and transfer_s >= 0
        assert httpx.get(front.base_url + "/health").status_code == 200
        assert "hetero_role_requests_total" in httpx.get(front.base_url + "/metrics").text


def _stream_in_background(client, results, key):
    def run():
        try:
            text = "".join(
                c.choices[0].text
                for c in client.completions.create(
                    model="m", prompt="stream me", max_tokens=60, temperature=0, stream=True
                )
            )
            results[key] = ("ok", text)
        except openai.APIError as exc:
            results[key] = ("error", str(exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _wait_health(front, status: int, timeout_s: float = 10.0) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        response = httpx.get(front.base_url + "/health", timeout=5)
        if response.status_code == status:
            return response
        time.sleep(0.1)
    raise AssertionError(f"/health did not answer {status} within {timeout_s}s")


SLOW_DECODE = {"HETERO_EXECUTOR__MOCK__DECODE_LATENCY_PER_STEP": "0.05"}


def test_a_killed_decode_role_fails_its_requests_with_a_5xx_naming_it(roles):
    prefill, decode = roles(SLOW_DECODE)
    with FrontEnd(prefill.url, decode.url, timeout_s=5.0) as front:
        client, results = front.openai(), {}
        threads = [_stream_in_background(client, results, i) for i in range(2)]
        time.sleep(1.0)  # both are decoding (60 steps of 50 ms)
        decode.kill()
        for thread in threads:
            thread.join(20)
        assert not any(t.is_alive() for t in threads), "a request hung after its decode role died"
        assert [r[0] for r in results.values()] == ["error", "error"]
        health = _wait_health(front, 503)
        assert "decode engine" in health.json()["reason"] and decode.url in health.json()["reason"]
        with pytest.raises(openai.InternalServerError) as failed:
            client.completions.create(model="m", prompt="new", max_tokens=3)
        assert failed.value.status_code == 503 and "decode engine" in str(failed.value)


def test_a_killed_prefill_role_fails_new_requests_and_spares_running_decodes(roles):
    prefill, decode = roles(SLOW_DECODE)
    with FrontEnd(prefill.url, decode.url, timeout_s=5.0) as front:
        client, results = front.openai(), {}
        thread = _stream_in_background(client, results, "running")
        time.sleep(1.0)  # prefilled, decoding on the decode role
        prefill.kill()
        health = _wait_health(front, 503)
        assert "prefill engine" in health.json()["reason"]
        with pytest.raises(openai.InternalServerError) as failed:
            client.completions.create(model="m", prompt="new", max_tokens=3)
        assert failed.value.status_code == 503 and "prefill engine" in str(failed.value)
        thread.join(30)
        assert results["running"][0] == "ok" and results["running"][1]  # its decode went on to the end


def test_flags_that_do_not_combine_are_refused_by_name():
    from hetero_core.errors import ConfigError
    from hetero_core.server.settings import load_server_settings

    with pytest.raises(ConfigError, match="leave out --role"):
        load_server_settings(role="decode", disaggregated=True)
    with pytest.raises(ConfigError, match="do not combine yet"):
        load_server_settings(disaggregated=True, replicas=2)
    assert load_server_settings(role="prefill").role == "prefill"


def test_the_launcher_hands_its_children_the_engine_flags_only():
    from hetero_core.disagg.launcher import _engine_argv

    assert _engine_argv(
        [
            "--disaggregated",
            "--port",
            "8000",
            "--host=0.0.0.0",
            "--executor",
            "mock",
            "--max-model-len",
            "256",
        ]
    ) == ["--executor", "mock", "--max-model-len", "256"]


def test_the_front_end_alone_serves_over_roles_started_elsewhere(roles):
    import signal
    import subprocess
    import sys

    from tests.server.disagg_roles import free_port

    prefill, decode = roles()
    port = free_port()
    front = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hetero_core",
            "serve",
            "--prefill-url",
            prefill.url,
            "--decode-url",
            decode.url,
            "--port",
            str(port),
            "--served-model-name",
            "m",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and front.poll() is None:
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=30)
        assert client.completions.create(model="m", prompt="hi", max_tokens=4).usage.completion_tokens == 4
    finally:
        front.send_signal(signal.SIGINT)
        output, _ = front.communicate(timeout=60)
    assert front.returncode == 130 and "Traceback" not in output, output
