"""``hetero serve``'s exit codes (one engine, mock executor): stopped by SIGTERM as by Ctrl-C (a
request still running ends with an error event and ``[DONE]``; exit 130), and an address it cannot
listen on refused in one line (exit 2). Tensor-parallel and replica servers: tests/distributed,
tests/replicas."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time

import httpx
import pytest

from tests.cli_helpers import clean_env, hetero, hetero_command
from tests.process_tree import live_in_session, still_alive


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("to", ["the process", "its process group"])
def test_sigterm_stops_hetero_serve_as_ctrl_c_does(to):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = clean_env({"HETERO_EXECUTOR__MOCK__DECODE_LATENCY_PER_STEP": "0.01"})  # 1,000 tokens: 10 s at least
    server = subprocess.Popen(
        hetero_command(
            "serve",
            "--executor",
            "mock",
            "--port",
            str(port),
            "--served-model-name",
            "mock-model",
            "--graceful-shutdown-seconds",
            "0",
            "--log-level",
            "warning",
        ),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    events: list[str] = []
    started = threading.Event()

    def stream() -> None:
        body = {"model": "mock-model", "prompt": "hi", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as response:
            for line in response.iter_lines():
                started.set()
                if line:
                    events.append(line)

    try:
        deadline = time.monotonic() + 60  # hang guard
        while server.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        client = threading.Thread(target=stream)
        client.start()
        assert started.wait(60), "the stream did not start"
        if to == "the process":
            server.send_signal(signal.SIGTERM)
        else:
            os.killpg(server.pid, signal.SIGTERM)
        output, _ = server.communicate(timeout=60)
        client.join(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 130, output
    assert "Traceback" not in output and "hetero: interrupted" in output, output
    assert events[-1] == "data: [DONE]" and "the request was aborted" in events[-2], events[-2:]
    assert still_alive(list(live_in_session(server.pid)), 30) == []


def test_a_port_in_use_is_one_line_and_exit_2():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = hetero("serve", "--executor", "mock", "--port", str(port), timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"hetero: error: cannot listen on 127.0.0.1:{port}: Address already in use; "
        "choose another --port or --host, or stop what uses it"
    )
