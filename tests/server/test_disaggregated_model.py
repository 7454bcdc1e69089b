"""``hetero serve --disaggregated`` with the real embedded model: greedy output through the real
``openai`` client equals one engine's (short outputs), streamed and not; Ctrl-C stops all three processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.server.disagg_roles import free_port
from tests.server.live_server import LiveServer

FLAGS = ["--dtype", "float32", "--max-model-len", "512", "--block-size", "16", "--log-level", "warning"]
PROMPTS = ["The capital of France is", "Write a haiku about the sea. " * 6]


@pytest.fixture
def launcher(smollm2_dir):
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hetero_core",
            "serve",
            "--disaggregated",
            "--port",
            str(port),
            "--served-model-name",
            "m",
            *FLAGS,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.2)
    yield base, process
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def test_the_disaggregated_pair_gives_one_engines_greedy_tokens(launcher, smollm2_dir):
    import openai

    from hetero_core.builder import build_engine
    from hetero_core.settings import load_settings

    base, process = launcher
    assert process.poll() is None, process.stdout.read()
    pair = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    engine = build_engine(
        load_settings(model=str(smollm2_dir), dtype="float32", max_model_len=512, block_size=16)
    )
    with LiveServer(engine) as single:
        one = single.client()
        for prompt in PROMPTS:
            kwargs = dict(prompt=prompt, max_tokens=8, temperature=0)
            want = one.completions.create(model="test-model", **kwargs).choices[0].text
            assert pair.completions.create(model="m", **kwargs).choices[0].text == want
            assert (
                "".join(c.choices[0].text for c in pair.completions.create(model="m", stream=True, **kwargs))
                == want
            )
        kwargs = dict(
            prompt=PROMPTS[0], max_tokens=4, temperature=0, logprobs=2
        )  # the first token's come from prefill
        want = one.completions.create(model="test-model", **kwargs).choices[0].logprobs
        got = pair.completions.create(model="m", **kwargs).choices[0].logprobs
        assert got.tokens == want.tokens and got.token_logprobs == pytest.approx(
            want.token_logprobs, abs=1e-4
        )
        assert [sorted(t) for t in got.top_logprobs] == [sorted(t) for t in want.top_logprobs]
        chat = dict(messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0)
        assert (
            pair.chat.completions.create(model="m", **chat).choices[0].message.content
            == one.chat.completions.create(model="test-model", **chat).choices[0].message.content
        )
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 130, output
    assert "Traceback" not in output
