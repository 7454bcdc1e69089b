"""``hetero serve`` says where it is: one line on stderr once it accepts connections."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import httpx


def test_the_ready_line_names_the_model_and_the_url_it_answers_on():
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hetero_core",
            "serve",
            "--executor",
            "mock",
            "--port",
            "0",
            "--served-model-name",
            "mock-model",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stderr.readline().strip()
        match = re.fullmatch(
            r"hetero: serving mock-model on (http://127\.0\.0\.1:(\d+)) \(OpenAI API at /v1\)", line
        )
        assert match, line
        assert int(match.group(2)) > 0  # the port actually bound, not 0
        assert httpx.get(match.group(1) + "/v1/models", timeout=10).json()["data"][0]["id"] == "mock-model"
    finally:
        process.send_signal(signal.SIGINT)
        _, rest = process.communicate(timeout=60)
    assert process.returncode == 130 and "Traceback" not in rest


def test_an_executor_without_a_model_is_announced_as_the_executor_not_a_model():
    process = subprocess.Popen(
        [sys.executable, "-m", "hetero_core", "serve", "--executor", "mock", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stderr.readline().strip()
        match = re.fullmatch(
            r"hetero: serving the mock executor \(no model\) on (http://127\.0\.0\.1:\d+) "
            r"\(OpenAI API at /v1\)",
            line,
        )
        assert match, line
        assert httpx.get(match.group(1) + "/v1/models", timeout=10).json()["data"][0]["id"] == "mock"
    finally:
        process.send_signal(signal.SIGINT)
        _, rest = process.communicate(timeout=60)
    assert process.returncode == 130 and "Traceback" not in rest


def test_the_served_model_is_the_model_the_executor_loads_or_the_name_given():
    from hetero_core.server.runner import served_model
    from hetero_core.server.settings import load_server_settings
    from hetero_core.settings import load_settings

    server = load_server_settings()
    assert served_model(load_settings(executor="mock"), server) == ("mock", "the mock executor (no model)")
    torch = load_settings(executor="torch", model="/models/qwen")  # looked up, not loaded
    assert served_model(torch, server) == ("/models/qwen", "/models/qwen")
    named = load_server_settings(served_model_name="mock-model")
    assert served_model(load_settings(executor="mock"), named) == ("mock-model", "mock-model")


def test_serve_says_once_at_start_that_structured_output_is_off_without_xgrammar(monkeypatch, capsys):
    import importlib.util

    from hetero_core.cli import serve
    from hetero_core.settings import load_settings

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "xgrammar" else real_find_spec(name, *a)
    )
    serve._say_if_structured_output_is_off(load_settings(executor="mock"))
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "structured output is off" in lines[0]
    assert "pip install 'hetero-core[structured]'" in lines[0]
    monkeypatch.setattr(importlib.util, "find_spec", real_find_spec)
    serve._say_if_structured_output_is_off(load_settings(executor="mock"))  # installed here: nothing said
    assert capsys.readouterr().err == ""
