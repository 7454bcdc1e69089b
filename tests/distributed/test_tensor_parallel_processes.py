"""Tensor-parallel workers as processes: started without re-running the caller's script (a script
with no ``__main__`` guard, stdin, ``-c``), reported in one line when they die or exit, and never
left behind, even when rank 0 is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from hetero_core.builder import build_engine  # noqa: E402
from hetero_core.engine.requests.params import SamplingParams  # noqa: E402
from hetero_core.errors import ConfigError, ExecutorDeadError  # noqa: E402
from hetero_core.plugin_system.discovery import load_plugins  # noqa: E402
from hetero_core.plugin_system.hookspecs import hookimpl  # noqa: E402
from hetero_core.settings import load_settings  # noqa: E402
from tests.process_tree import live_children, still_alive  # noqa: E402

REPO = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # the tests package's parent
PROMPTS = [[5, 17, 33, 2, 48, 71, 9, 64], [12, 88, 40, 3], [27, 55, 61, 19, 7, 90, 14]]
ENGINE = dict(tokenizer="byte", block_size=4, max_model_len=128)
TORCH_FP32 = {"name": "torch", "torch": {"dtype": "float32"}}  # not "auto": the same dtype on any CPU
GONE_WITHIN_S = 60  # hang guard only: workers exit at once when rank 0's socket closes

# A user's script, as written: no ``if __name__ == "__main__":`` guard, no shutdown() at the end.
SCRIPT = """\
import json
from hetero_core import LLM, SamplingParams
llm = LLM(model={model!r}, executor={executor!r}, tensor_parallel_size={size}, **{engine!r})
outputs = llm.generate({prompts!r}, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
print(json.dumps({{"tokens": [o.output_token_ids for o in outputs],
                  "workers": llm.engine.executor.worker_pids}}))
"""


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    from tests.model.tiny_models import save_tiny_model

    root = tmp_path_factory.mktemp("tp_processes")
    for name in ("llama", "llama_three_ranks"):
        save_tiny_model(name, root / name)
    return root


def reference_tokens(model_dir) -> list[list[int]]:
    """The greedy tokens of one rank, in this process."""
    engine = build_engine(
        load_settings(model=str(model_dir), executor=TORCH_FP32, **ENGINE), load_plugins(entry_points=[])
    )
    try:
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        return [o.output_token_ids for o in engine.generate(PROMPTS, params)]
    finally:
        engine.shutdown()


@pytest.mark.parametrize(
    ("how", "model", "size"),
    [
        ("script file", "llama", 2),
        ("stdin", "llama", 2),
        ("-c", "llama", 2),
        ("script file", "llama_three_ranks", 3),
    ],
)
def test_a_script_without_a_main_guard_runs_tensor_parallel(tiny_dirs, tmp_path, how, model, size):
    script = SCRIPT.format(
        model=str(tiny_dirs / model), executor=TORCH_FP32, size=size, engine=ENGINE, prompts=PROMPTS
    )
    path = tmp_path / "user_script.py"
    path.write_text(script)
    command = {
        "script file": [sys.executable, str(path)],
        "stdin": [sys.executable, "-"],
        "-c": [sys.executable, "-c", script],
    }[how]
    result = subprocess.run(
        command,
        input=script if how == "stdin" else None,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    assert "RuntimeError" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["tokens"] == reference_tokens(tiny_dirs / model)
    assert len(report["workers"]) == size - 1
    assert still_alive(report["workers"], GONE_WITHIN_S) == []  # the script ended without shutdown()


def faulty_engine(model_dir, **faulty):
    import tests.distributed.tp_faults as tp_faults

    plugins = load_plugins(entry_points=[], extra_plugins=[("faulty", tp_faults)])
    settings = load_settings(
        model=str(model_dir), tensor_parallel_size=2, executor={"name": "faulty", "faulty": faulty}, **ENGINE
    )
    return build_engine(settings, plugins)


@pytest.mark.parametrize(
    ("how", "cause"),
    [
        ("exit", "exited with code 3 (its last stderr line: 'faulty executor: rank 1 exits')"),
        ("raise", "failed: RuntimeError: injected fault on rank 1"),
    ],
)
def test_a_worker_that_fails_while_starting_fails_the_build_in_one_line(tiny_dirs, how, cause):
    with pytest.raises(ExecutorDeadError) as error:
        faulty_engine(tiny_dirs / "llama", rank=1, after=-1, how=how)
    assert str(error.value) == f"tensor-parallel worker rank 1 {cause}; the engine did not start"


def test_a_worker_that_exits_mid_run_is_named_with_its_exit_code_and_last_stderr_line(tiny_dirs):
    engine = faulty_engine(tiny_dirs / "llama", rank=1, after=2, how="exit")
    try:
        with pytest.raises(ExecutorDeadError) as error:
            engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        assert str(error.value) == (
            "tensor-parallel worker rank 1 exited with code 3 (its last stderr line: "
            "'faulty executor: rank 1 exits'); the engine has stopped"
        )
    finally:
        engine.shutdown()


def test_workers_exit_when_rank_0_is_killed(tiny_dirs, tmp_path):
    """Rank 0 killed with SIGKILL (no clean-up of its own) while a worker is busy: the worker goes."""
    script = textwrap.dedent(f"""\
        import tests.distributed.tp_faults as tp_faults
        from hetero_core import LLM
        from hetero_core.plugin_system.discovery import load_plugins

        if __name__ == "__main__":
            plugins = load_plugins(entry_points=[], extra_plugins=[("faulty", tp_faults)])
            LLM(model={str(tiny_dirs / "llama")!r}, tensor_parallel_size=2, plugin_set=plugins,
                executor={{"name": "faulty", "faulty": {{"rank": 1, "after": -1, "how": "hang"}}}},
                **{ENGINE!r})
        """)
    (tmp_path / "rank0.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (REPO, os.environ.get("PYTHONPATH"))))}
    rank0 = subprocess.Popen(
        [sys.executable, str(tmp_path / "rank0.py")], stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        for line in rank0.stderr:  # the worker's stderr passes through rank 0's
            if "faulty executor: rank 1 hangs" in line:
                break
        workers = list(live_children(rank0.pid))
        assert workers, "rank 0 has no worker"
    finally:
        rank0.kill()
        rank0.wait()
    assert still_alive(workers, GONE_WITHIN_S) == []


def test_a_factory_defined_in_main_is_refused_before_any_worker_starts(tiny_dirs):
    def create(ctx):
        raise AssertionError("not called")

    create.__module__ = "__main__"  # as if defined in the script being run

    class MainPlugin:
        @hookimpl
        def register_executors(self, register):
            register("in_main", create, needs_model=True, tensor_parallel=True)

    settings = load_settings(
        model=str(tiny_dirs / "llama"), tensor_parallel_size=2, executor="in_main", **ENGINE
    )
    with pytest.raises(ConfigError) as error:
        build_engine(settings, load_plugins(entry_points=[], extra_plugins=[("in_main", MainPlugin())]))
    message = str(error.value)
    assert "executor 'in_main' cannot start tensor-parallel workers" in message
    assert "is defined in __main__" in message and "define it in a module they can import" in message


def test_hetero_serve_with_two_ranks_stops_on_sigterm_to_its_process_group(tiny_dirs):
    """A service manager's stop (SIGTERM to every process): exit 130 as after Ctrl-C, workers gone."""
    import httpx

    from tests.cli_helpers import clean_env, hetero_command

    port = free_port()
    server = subprocess.Popen(
        hetero_command(
            "serve",
            "--model",
            str(tiny_dirs / "llama"),
            "--executor",
            "torch",
            "-tp",
            "2",
            "--tokenizer",
            "byte",
            "--block-size",
            "4",
            "--max-model-len",
            "128",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ),
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for_health(server, f"http://127.0.0.1:{port}/health")
        workers = list(live_children(server.pid))
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            timeout=60,
            json={"model": str(tiny_dirs / "llama"), "prompt": "hi", "max_tokens": 4},
        )
        assert answer.status_code == 200, answer.text
        os.killpg(server.pid, signal.SIGTERM)
        output, _ = server.communicate(timeout=120)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 130, output
    assert "Traceback" not in output, output
    assert len(workers) == 1 and still_alive(workers, GONE_WITHIN_S) == []


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_health(process: subprocess.Popen, url: str) -> None:
    import httpx

    deadline = time.monotonic() + 180  # hang guard: loading two ranks takes seconds
    while process.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError(f"the server did not come up (exit code {process.poll()})")
