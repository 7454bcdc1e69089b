"""``hetero run`` answered by a running ``hetero serve`` (the mock executor): the same output as a local
run, only when every output-affecting setting matches, never by a stale record, and not when opted out."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

from hetero_core.cache.serve_registry import ServerRecord, live_servers, record_server, registry_dir
from hetero_core.cli.serve_identity import ENGINE_VARIABLES, identity, matches
from hetero_core.settings import load_settings
from tests.cli.serve_process import running_serve
from tests.cli_helpers import clean_env, default_sigint, hetero, hetero_command

pytest.importorskip("uvicorn")
REUSED = "answered by hetero serve at"
MOCK = ("--executor", "mock")


def run(cache_dir, *args, env=None, stdin=None):
    """``hetero run ARGS`` with ``cache_dir`` as its cache, reuse on unless ``env`` says otherwise."""
    env = {"HETERO_CACHE_DIR": str(cache_dir), "HETERO_REUSE_SERVER": "true", **(env or {})}
    return hetero("run", *args, env=env, stdin=stdin)


def local(cache_dir, *args, env=None):
    return run(cache_dir, "--no-reuse-server", *args, env=env)


def assert_reused(result):
    assert REUSED in result.stderr, result.stderr
    assert "--- prefix cache" not in result.stderr  # the local run's engine line: no engine ran here


def assert_local(result):
    assert REUSED not in result.stderr and ", load " in result.stderr, result.stderr


def test_a_matching_serve_answers_with_the_local_runs_text_streamed_batched_and_sampled(tmp_path):
    with running_serve(tmp_path, *MOCK):
        for args in (
            ("--max-tokens", "20", "hi"),
            ("--max-tokens", "30", "--temperature", "0.8", "--seed", "7", "--top-k", "5", "hi"),
            ("--max-tokens", "12", "--stop", "x", "--ignore-eos", "a prompt"),
            ("--max-tokens", "30", "seven", "three", "--input", "ninety"),
        ):
            reused, alone = run(tmp_path, *MOCK, *args), local(tmp_path, *MOCK, *args)
            assert reused.returncode == alone.returncode == 0, reused.stderr
            assert reused.stdout == alone.stdout and reused.stdout.strip()
            assert_reused(reused)
            assert_local(alone)
        piped = run(tmp_path, *MOCK, "--max-tokens", "9", stdin="from stdin\n")
        assert piped.stdout == local(tmp_path, *MOCK, "--max-tokens", "9", "from stdin").stdout
        assert_reused(piped)


def test_a_failed_request_fails_as_in_a_local_run(tmp_path):
    args = (*MOCK, "--max-model-len", "40", "--max-tokens", "8")
    with running_serve(tmp_path, *args):
        for prompts in (("x" * 80,), ("ok", "x" * 80, "fine")):
            reused, alone = run(tmp_path, *args, *prompts), local(tmp_path, *args, *prompts)
            assert reused.returncode == alone.returncode == 1
            assert reused.stdout == alone.stdout
            failed = [line for line in alone.stderr.splitlines() if line.startswith("hetero: request")]
            assert failed and failed == [
                line for line in reused.stderr.splitlines() if line.startswith("hetero: request")
            ]
            assert_reused(reused)
        system = run(tmp_path, *args, "--no-chat", "--system", "be brief", "hi")
        assert system.returncode == 2 and "--system needs the chat template" in system.stderr


def test_no_reuse_when_a_setting_that_changes_the_output_differs(tmp_path):
    with running_serve(tmp_path, *MOCK, "--seed", "3"):
        for args, env in (
            (("--max-model-len", "1024"), None),  # an engine setting
            (("--max-num-seqs", "4"), None),
            (("--max-num-blocks", "1024"), None),  # the default's value, but given: the pool is not sized
            ((), {"HETERO_EXECUTOR__MOCK__EOS_AFTER": "5"}),  # an executor option
            (("--scheduler-policy", "priority"), None),  # a component
            ((), None),  # no seed: the server would seed it with its own 3
        ):
            result = run(tmp_path, *MOCK, "--max-tokens", "5", *args, "hi", env=env)
            assert result.returncode == 0, result.stderr
            assert_local(result)
        seeded = run(tmp_path, *MOCK, "--max-tokens", "5", "--seed", "11", "hi")  # sent: the server's unused
        assert_reused(seeded)


def test_the_opt_out_setting_flag_and_variable_keep_the_run_local_and_the_serve_unrecorded(tmp_path):
    config = tmp_path / "hetero.toml"
    config.write_text("reuse_server = false\n")
    with running_serve(tmp_path, *MOCK):
        assert_reused(run(tmp_path, *MOCK, "--max-tokens", "4", "hi"))
        assert_local(local(tmp_path, *MOCK, "--max-tokens", "4", "hi"))
        assert_local(run(tmp_path, *MOCK, "--max-tokens", "4", "hi", env={"HETERO_REUSE_SERVER": "false"}))
        unset = {"HETERO_REUSE_SERVER": None}  # the file's setting, not the variable's (which wins)
        assert_reused(run(tmp_path, *MOCK, "--max-tokens", "4", "hi", env=unset))  # the default
        assert_local(run(tmp_path, *MOCK, "--config", str(config), "--max-tokens", "4", "hi", env=unset))
    with running_serve(tmp_path, *MOCK, "--no-reuse-server", recorded=False):
        assert not list(registry_dir(tmp_path).glob("*.json"))
        assert_local(run(tmp_path, *MOCK, "--max-tokens", "4", "hi"))


def test_a_server_with_an_api_key_is_reused_only_with_the_key(tmp_path):
    with running_serve(tmp_path, *MOCK, env={"HETERO_API_KEY": "sk-test"}) as record:
        assert record.needs_api_key and "sk-test" not in json.dumps(record.identity)
        assert_local(run(tmp_path, *MOCK, "--max-tokens", "4", "hi"))
        wrong = run(tmp_path, *MOCK, "--max-tokens", "4", "hi", env={"HETERO_API_KEY": "sk-wrong"})
        assert wrong.returncode == 0 and wrong.stdout.strip()  # 401: answered locally
        assert_local(wrong)
        keyed = run(tmp_path, *MOCK, "--max-tokens", "4", "hi", env={"HETERO_API_KEY": "sk-test"})
        assert_reused(keyed)


def test_reusing_a_server_imports_no_torch(tmp_path):
    with running_serve(tmp_path, *MOCK):
        result = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "hetero_core", "run", *MOCK, "--max-tokens=3", "hi"],
            capture_output=True,
            text=True,
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("HETERO_")},
                "HETERO_CACHE_DIR": str(tmp_path),
            },
            timeout=120,
        )
    assert result.returncode == 0 and REUSED in result.stderr, result.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "hetero_core.cli.run_on_server" in imported
    assert not {m for m in imported if m.split(".")[0] in ("torch", "numpy", "httpx", "fastapi")}


def settings(**values):
    return load_settings(executor="mock", **values)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def record(pid: int, port: int, **values) -> ServerRecord:
    return ServerRecord(
        host="127.0.0.1",
        port=port,
        pid=pid,
        model_name="mock",
        identity=identity(settings(**values)),
        needs_api_key=False,
        has_chat_template=False,
    )


def test_stale_records_are_ignored_and_removed(tmp_path):
    dead = record_server(tmp_path, record(dead_pid(), closed_port()))
    closed = record_server(tmp_path, record(os.getpid(), closed_port()))  # a live pid, no server
    broken = registry_dir(tmp_path) / "broken.json"
    broken.write_text("{not json")
    assert live_servers(tmp_path) == []
    assert not dead.exists() and not closed.exists()
    assert broken.exists()  # not a record it can judge: left alone
    result = run(tmp_path, *MOCK, "--max-tokens", "4", "hi")
    assert result.returncode == 0 and result.stdout.strip()
    assert_local(result)


def test_a_live_port_that_cannot_answer_leaves_the_run_local(tmp_path):
    # A record naming a live process whose port speaks HTTP but is no hetero serve: POST gets 501.
    port = closed_port()
    other = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not _accepts(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        record_server(tmp_path, record(other.pid, port))
        # the identity's variables as this process has them (conftest reports CPU flags through one)
        same = {name: os.environ.get(name) for name in ENGINE_VARIABLES}
        result = run(tmp_path, *MOCK, "--max-tokens", "4", "-v", "hi", env=same)
    finally:
        other.terminate()
        other.wait(timeout=30)
    assert result.returncode == 0 and result.stdout.strip()
    assert "run.server_unavailable" in result.stderr
    assert_local(result)


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_the_identity_ignores_what_the_run_sends_and_where_logs_go(tmp_path):
    server = identity(settings(temperature=0.5, max_tokens=9, log_level="debug", cache_dir=str(tmp_path)))
    assert matches(server, settings(temperature=0.0, top_p=0.5, chat=False, log_format="json"))
    assert matches(server, settings(seed=4))
    assert not matches(identity(settings(seed=4)), settings())
    assert not matches(server, settings(dtype="float32"))
    assert not matches(server, settings(max_batch_size=8))


def test_a_local_model_path_is_compared_by_its_absolute_path_and_files(tmp_path, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    server = identity(settings(model="model"))
    assert matches(server, settings(model=str(model)))
    (model / "config.json").write_text('{"changed": 1}')
    assert not matches(server, settings(model=str(model)))
    monkeypatch.chdir(model)
    assert not matches(identity(settings(model="model")), settings(model=str(model)))


def test_ctrl_c_while_a_server_streams_stops_at_once_and_exits_130(tmp_path):
    slow = {"HETERO_EXECUTOR__MOCK__DECODE_LATENCY_PER_STEP": "0.1"}  # 1000 tokens: ~100 s unless stopped
    with running_serve(tmp_path, *MOCK, env=slow):
        env = clean_env({"HETERO_CACHE_DIR": str(tmp_path), "HETERO_REUSE_SERVER": "true", **slow})
        proc = subprocess.Popen(
            hetero_command("run", *MOCK, "--max-tokens", "1000", "hi"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            preexec_fn=default_sigint,
        )
        try:
            first = b""
            while len(first) < 3:
                ready, _, _ = select.select([proc.stdout], [], [], 60)
                assert ready, f"nothing more was streamed after {first!r}"
                chunk = os.read(proc.stdout.fileno(), 3 - len(first))
                assert chunk, f"the output ended after {first!r}"
                first += chunk
            os.kill(proc.pid, signal.SIGINT)
            rest, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 130, err
        assert "interrupted" in err.decode() and "Traceback" not in err.decode()
        full = local(tmp_path, *MOCK, "--max-tokens", "1000", "hi").stdout.rstrip("\n")
        printed = (first + rest).decode().rstrip("\n")
        assert 3 <= len(printed) < len(full) and full.startswith(printed)
        after = run(tmp_path, *MOCK, "--max-tokens", "5", "hi", env=slow)  # the server carries on
        assert after.returncode == 0 and after.stdout == full[:5] + "\n"
        assert_reused(after)
