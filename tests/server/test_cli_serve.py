"""``hetero serve`` as a user runs it: a subprocess on loopback, stopped with Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from hetero_core.cli.main import main
from hetero_core.errors import ConfigError
from hetero_core.server.settings import load_server_settings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_hetero_serve_answers_openai_clients_and_stops_on_ctrl_c(tmp_path):
    port = free_port()
    env = {**os.environ, "HETERO_API_KEY": "sk-env", "HETERO_EXECUTOR__MOCK__EOS_AFTER": "6"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hetero_core",
            "serve",
            "--executor",
            "mock",
            "--port",
            str(port),
            "--served-model-name",
            "mock-model",
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        client = openai.OpenAI(base_url=base + "/v1", api_key="sk-env", max_retries=0, timeout=30)
        result = client.chat.completions.create(
            model="mock-model", messages=[{"role": "user", "content": "hi"}]
        )
        assert result.choices[0].finish_reason == "stop" and result.usage.completion_tokens == 6
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base + "/v1", api_key="nope", max_retries=0).models.list()
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 130, output  # the shell convention for Ctrl-C, after a clean shutdown
    assert "Traceback" not in output


def test_serve_without_the_server_extra_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if uvicorn were not installed
    monkeypatch.delitem(sys.modules, "hetero_core.server.runner", raising=False)
    assert main(["serve", "--executor", "mock"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install 'hetero-core[server]'" in err and "uvicorn" in err


def test_server_settings_come_from_flags_then_environment(monkeypatch):
    monkeypatch.setenv("HETERO_API_KEY", "from-env")
    monkeypatch.setenv("HETERO_PORT", "9001")
    settings = load_server_settings(port=9002)
    assert settings.key() == "from-env" and settings.port == 9002 and settings.host == "127.0.0.1"
    assert "from-env" not in repr(settings)  # the key is a secret
    with pytest.raises(ConfigError, match="port"):
        load_server_settings(port=70000)
