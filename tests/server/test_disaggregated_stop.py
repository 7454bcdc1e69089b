"""``hetero serve --disaggregated`` (and the front end alone, and one role) stopped as plain mode is: a
SIGTERM under load ends every running stream with an error event or a finish, then ``[DONE]``; the
server exits 130 and leaves no child. A role process that dies is reaped at once, restarted (with
backoff, ``role_restart_retries`` times), its requests in flight get an error, later ones are served
again; after the last retry the launcher exits with one line naming the role."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.cli_helpers import clean_env, hetero_command
from tests.process_tree import live_children, live_in_session, still_alive
from tests.server.disagg_roles import FrontEnd, Role, free_port

MOCK = ["--executor", "mock", "--block-size", "4", "--log-level", "warning"]
SLOW = {"HETERO_EXECUTOR__MOCK__DECODE_LATENCY_PER_STEP": "0.01"}  # 1,000 tokens: 10 s at least
HANG_GUARD_S = 120


def _start(args: list[str], env: dict | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    server = subprocess.Popen(
        hetero_command("serve", *args, "--port", str(port), "--served-model-name", "m"),
        env=clean_env({**SLOW, **(env or {})}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    _wait_health(base, 200, server)
    return server, base


def _wait_health(base: str, status: int, server: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline and (server is None or server.poll() is None):
        try:
            if httpx.get(base + "/health", timeout=2).status_code == status:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    output = server.communicate(timeout=30)[0] if server is not None and server.poll() is not None else ""
    raise AssertionError(f"{base}/health did not answer {status}: {output}")


class Streams:
    """``count`` streamed completions of 1,000 tokens in threads; ``events[i]``: stream i's data lines."""

    def __init__(self, base: str, count: int) -> None:
        self.events: list[list[str]] = [[] for _ in range(count)]
        self.started = [threading.Event() for _ in range(count)]
        self.threads = [threading.Thread(target=self._run, args=(base, i), daemon=True) for i in range(count)]
        for thread in self.threads:
            thread.start()
        for started in self.started:
            assert started.wait(HANG_GUARD_S), "a stream did not start"

    def _run(self, base: str, i: int) -> None:
        body = {"model": "m", "prompt": f"stream {i}", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", base + "/v1/completions", json=body, timeout=HANG_GUARD_S) as response:
                for line in response.iter_lines():
                    if line:
                        self.events[i].append(line)
                        self.started[i].set()
        except httpx.HTTPError as exc:
            self.events[i].append(f"cut: {type(exc).__name__}")

    def join(self) -> None:
        for thread in self.threads:
            thread.join(HANG_GUARD_S)
        assert not any(t.is_alive() for t in self.threads), "a stream hung"

    def assert_each_ended_with_an_error_or_a_finish_then_done(self, error: str) -> None:
        for events in self.events:
            assert events[-1] == "data: [DONE]", events[-2:]
            last = json.loads(events[-2].removeprefix("data: "))
            finished = "choices" in last and last["choices"] and last["choices"][0]["finish_reason"]
            assert finished or error in last["error"]["message"], last


def _kill(server: subprocess.Popen, children) -> None:
    """After a failed check: the server and its role processes (in sessions of their own), by pid."""
    for pid in [*children, server.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    server.communicate(timeout=30)


def _stop(server: subprocess.Popen, to: str) -> str:
    children = list(live_children(server.pid))
    if to == "the process":
        server.send_signal(signal.SIGTERM)
    else:
        os.killpg(server.pid, signal.SIGTERM)
    try:
        return server.communicate(timeout=HANG_GUARD_S)[0]
    finally:
        if server.poll() is None:
            _kill(server, children)


@pytest.mark.parametrize("to", ["the process", "its process group"])
def test_a_disaggregated_server_stopped_under_load_ends_every_stream_then_exits_130(to):
    server, base = _start(["--disaggregated", "--graceful-shutdown-seconds", "0", *MOCK])
    children = list(live_children(server.pid))
    assert len(children) == 2
    streams = Streams(base, 3)
    output = _stop(server, to)
    streams.join()
    assert server.returncode == 130, output
    assert "Traceback" not in output and "hetero: interrupted" in output, output
    streams.assert_each_ended_with_an_error_or_a_finish_then_done("the request was aborted")
    assert still_alive(children, 30) == [] and still_alive(list(live_in_session(server.pid)), 30) == []


def test_the_front_end_alone_stopped_under_load_ends_every_stream_then_exits_130():
    prefill, decode = Role("prefill", MOCK, SLOW), Role("decode", MOCK, SLOW)
    try:
        prefill.wait_ready()
        decode.wait_ready()
        server, base = _start(
            [
                "--prefill-url",
                prefill.url,
                "--decode-url",
                decode.url,
                "--graceful-shutdown-seconds",
                "0",
                "--log-level",
                "warning",
            ]
        )
        streams = Streams(base, 3)
        output = _stop(server, "the process")
        streams.join()
        assert server.returncode == 130, output
        assert "Traceback" not in output and "hetero: interrupted" in output, output
        streams.assert_each_ended_with_an_error_or_a_finish_then_done("the request was aborted")
        assert httpx.get(decode.url + "/health", timeout=5).status_code == 200  # the roles serve on
    finally:
        for role in (prefill, decode):
            role.kill()


def test_a_role_stopped_under_load_ends_its_streams_then_exits_130():
    prefill = Role("prefill", MOCK, SLOW)
    decode = Role("decode", [*MOCK, "--graceful-shutdown-seconds", "0"], SLOW)
    try:
        prefill.wait_ready()
        decode.wait_ready()
        with FrontEnd(prefill.url, decode.url, timeout_s=10.0) as front:
            streams = Streams(front.base_url, 2)
            decode.process.send_signal(signal.SIGTERM)
            output = decode.process.communicate(timeout=HANG_GUARD_S)[0]
            streams.join()
        assert decode.process.returncode == 130, output
        assert "Traceback" not in output and "hetero: interrupted" in output, output
        streams.assert_each_ended_with_an_error_or_a_finish_then_done("the request was aborted")
    finally:
        for role in (prefill, decode):
            if role.process.poll() is None:
                role.kill()


def _role(server: subprocess.Popen, role: str, other_than: int | None = None) -> tuple[int, str]:
    """The pid and URL of the launcher's ``role`` child (not ``other_than``)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        found = [
            (pid, cmd)
            for pid, cmd in live_children(server.pid).items()
            if f"--role {role}" in cmd and pid != other_than
        ]
        if found:
            pid, cmd = found[0]
            return pid, "http://127.0.0.1:" + cmd.split("--port ")[1].split()[0]
        time.sleep(0.05)
    raise AssertionError(f"no {role} child")


def _reaped(pid: int, timeout: float = 10.0) -> bool:
    """``pid`` is gone from /proc altogether (no ``<defunct>`` entry left for its parent to wait on)."""
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return not Path(f"/proc/{pid}").exists()


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_killed_role_is_reaped_restarted_and_served_again_until_the_last_retry(role):
    env = {"HETERO_ROLE_RESTART_RETRIES": "1", "HETERO_ROLE_RESTART_BACKOFF_SECONDS": "0.1"}
    server, base = _start(["--disaggregated", "--graceful-shutdown-seconds", "0", *MOCK], env)
    children = list(live_children(server.pid))
    try:
        first, url = _role(server, role)
        streams = Streams(base, 1) if role == "decode" else None
        os.kill(first, signal.SIGKILL)
        assert _reaped(first), f"the killed {role} child was not reaped"
        if streams is not None:  # the request it was serving gets an error, then [DONE]
            streams.join()
            streams.assert_each_ended_with_an_error_or_a_finish_then_done("decode engine")
            assert "finish_reason" not in streams.events[0][-2]
        second, second_url = _role(server, role, other_than=first)
        assert second_url == url  # restarted where the front end sends its requests
        _wait_health(second_url, 200)
        answer = httpx.post(
            base + "/v1/completions",
            json={"model": "m", "prompt": "again", "max_tokens": 3},
            timeout=HANG_GUARD_S,
        )
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3, answer.text
        children = list(live_children(server.pid))
        os.kill(second, signal.SIGKILL)  # the second death within the window: no retry left
        output = server.communicate(timeout=HANG_GUARD_S)[0]
    finally:
        if server.poll() is None:
            _kill(server, [*children, *live_children(server.pid)])
    lines = [line for line in output.splitlines() if line.startswith("hetero: error:")]
    assert server.returncode == 2 and len(lines) == 1 and f"the {role} engine process" in lines[0], output
    assert "Traceback" not in output and "killed by SIGKILL" in output, output
    assert still_alive(children, 30) == [] and still_alive(list(live_in_session(server.pid)), 30) == []


def test_the_restart_settings_apply_to_disaggregated_only_and_a_cause_reads_as_words():
    from hetero_core.disagg.supervisor import exit_cause
    from hetero_core.errors import ConfigError
    from hetero_core.server.settings import load_server_settings

    with pytest.raises(ConfigError, match="--role-restart-retries applies to .* add --disaggregated"):
        load_server_settings(role="decode", role_restart_retries=2)
    assert load_server_settings(disaggregated=True, role_restart_retries=0).role_restart_retries == 0
    assert exit_cause(-signal.SIGKILL) == "was killed by SIGKILL" and exit_cause(1) == "exited with status 1"


def test_the_roles_stop_themselves_when_their_launcher_is_killed():
    server, _ = _start(["--disaggregated", *MOCK])
    children = list(live_children(server.pid))
    assert len(children) == 2
    _kill(server, [])  # the launcher alone: SIGKILL, no chance to stop its children
    assert still_alive(children, 30) == []
