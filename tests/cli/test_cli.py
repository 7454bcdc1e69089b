"""The hetero command, run as a user would: a subprocess. Errors, logging, settings, plugins."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import hetero

DATA = Path(__file__).parents[1] / "data"


def test_run_mock_prints_text_and_summary():
    result = hetero("run", "--executor", "mock", "你好，世界！", "--max-tokens", "12", "--temperature", "0")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip()) == 12
    assert "12 tokens in" in result.stderr and "tokens/s" in result.stderr
    # By default only warnings are logged: the stats line is all there is on stderr.
    assert result.stderr.strip().splitlines() == [
        line for line in result.stderr.strip().splitlines() if line.startswith("--- ")
    ]


def test_verbose_shows_request_events_and_vv_shows_steps():
    quiet = hetero("run", "--executor", "mock", "hi", "--max-tokens", "3")
    assert "request.finished" not in quiet.stderr
    verbose = hetero("run", "--executor", "mock", "hi", "--max-tokens", "3", "-v")
    assert "request.admitted" in verbose.stderr and "request.finished" in verbose.stderr
    assert "engine.step" not in verbose.stderr
    assert "engine.step" in hetero("run", "--executor", "mock", "hi", "--max-tokens", "3", "-vv").stderr
    # An explicit --log-level wins over -v.
    assert (
        "request.finished"
        not in hetero("run", "--executor", "mock", "hi", "-v", "--log-level", "warning").stderr
    )


def test_run_mock_with_input_flags_and_config(tmp_path):
    config = tmp_path / "hetero.toml"
    config.write_text('max_tokens = 5\n[executor]\nname = "mock"\n[executor.mock]\neos_after = 3\n')
    result = hetero(
        "run", "--config", str(config), "--input", "one", "--input", "two", "--log-format", "json", "-v"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("=== ") == 2
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    finished = [e for e in events if e["event"] == "request.finished"]
    assert len(finished) == 2 and {e["finish_reason"] for e in finished} == {"eos"}
    assert all(e["num_output_tokens"] == 3 for e in finished)


def _mock_run_then(probe: str) -> str:
    """stderr of a fresh interpreter that runs `hetero run` on the mock in-process, then prints
    ``RC <status> <probe's value>`` (``probe``: a Python expression; ``sys`` is imported)."""
    code = (
        "import sys; from hetero_core.cli.main import main; "
        "rc = main(['run', '--executor', 'mock', 'hi', '--max-tokens', '4']); "
        f"print('RC', rc, {probe}, file=sys.stderr)"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, input=""
    ).stderr


def test_hetero_run_on_the_mock_imports_no_torch():
    stderr = _mock_run_then("'TORCH' if 'torch' in sys.modules else 'NO-TORCH'")
    assert "RC 0 NO-TORCH" in stderr, stderr


def test_hetero_run_builds_only_its_own_flags():
    """`hetero run` skips what other commands' flags need (the server's settings import its engine)."""
    stderr = _mock_run_then("sorted(m for m in sys.modules if m.startswith('hetero_core.server'))")
    assert "RC 0 []" in stderr, stderr
    assert "--max-body-bytes" in hetero("serve", "--help").stdout


def test_hetero_run_exits_at_once_with_its_output_whole_and_exit_handlers_run():
    code = (
        "import atexit, sys; atexit.register(lambda: print('EXIT HANDLER RAN', file=sys.stderr)); "
        "sys.argv = ['hetero', 'run', '--executor', 'mock', 'hi', '--max-tokens', '2000', "
        "'--temperature', '0']; "
        "from hetero_core.cli.main import console_main; console_main(); print('NOT REACHED', file=sys.stderr)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, input=""
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip()) == 2000  # the mock's tokens are one character each
    assert "2000 tokens in" in result.stderr and "EXIT HANDLER RAN" in result.stderr
    assert "NOT REACHED" not in result.stderr
    failed = subprocess.run(
        [sys.executable, "-c", code.replace("2000", "3000")],
        capture_output=True,
        text=True,
        timeout=60,
        input="",
    )
    assert failed.returncode == 1 and "exceeds max_model_len" in failed.stderr  # its status kept


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["run", "--executor", "cdua", "hi"],
            "unknown executor 'cdua'; available: cuda, mock, null, torch, triton; did you mean 'cuda'?",
        ),
        (
            ["run", "--executor", "cuda", "--plugins", "mock", "hi"],
            "unknown executor 'cuda'; available: mock, null, torch; plugin 'cuda' is installed "
            "but disabled by the plugins allow-list",
        ),
        (
            ["run", "--executor", "cdua", "--plugins", "mock", "hi"],
            "disabled by the plugins allow-list (HETERO_PLUGINS / --plugins): bench, cuda, fair-share, phi3, "
            "triton",
        ),
        (
            ["run", "--executor", "mock", "--plugins", "mock,mokc", "hi"],
            "names 'mokc', which is not installed; installed plugins: bench, cuda, fair-share, mock, phi3, "
            "triton; "
            "did you mean 'mock'?",
        ),
        (["plugins", "--plugins", "nonexistent"], "names 'nonexistent', which is not installed"),
        (["run", "--executor", "mock", "--block-size", "-4", "hi"], "block_size: Input should be greater"),
        (["run", "--executor", "mock", "--memory-threshold", "1.5", "hi"], "memory_threshold"),
        (["run", "--executor", "mock", "--config", "/no/such/file.toml", "hi"], "settings file not found"),
        (["run", "--executor", "mock"], "no prompt given"),
        (["run", "--executor", "mock", "-"], "no prompt given: stdin was empty"),
        (["run", "--executor", "mock", "--top-p", "0", "hi"], "top_p"),
        (["run", "--executor", "triton", "hi"], "executor 'triton' cannot run here"),
        (["run", "--executor", "cuda", "hi"], "executor 'cuda' cannot run here: no CUDA device"),
        (
            ["run", "--executor", "mock", "--config", str(DATA / "unknown-section.toml"), "hi"],
            "unknown executor 'mokc'",
        ),
    ],
)
def test_user_mistakes_give_one_line_and_exit_2(args, message):
    result = hetero(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_executor_that_cannot_run_here_fails_before_the_model_is_converted(tmp_path):
    # the triton executor's preflight sees its options: without a GPU and without the interpreter it
    # cannot run, and says so before the embedded GGUF is converted into an empty cache
    result = hetero("run", "--executor", "triton", "hi", env={"HETERO_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "hetero: error: executor 'triton' cannot run here: no CUDA device is visible to torch; set "
        "executor.triton.interpreter = true (or TRITON_INTERPRET=1) to run its kernels on the CPU through "
        "Triton's interpreter (slow), or use --executor torch"
    ]
    assert not any(tmp_path.iterdir())


def test_hetero_plugins_naming_a_missing_plugin_is_an_error():
    result = hetero("run", "hi", env={"HETERO_PLUGINS": "nonexistent", "HETERO_EXECUTOR": "mock"})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        "names 'nonexistent', which is not installed; installed plugins: bench, cuda, fair-share, mock, "
        "phi3, triton" in result.stderr
    )


def test_unknown_hetero_variable_gets_a_warning_naming_the_closest_setting():
    result = hetero(
        "run",
        "--executor",
        "mock",
        "hi",
        "--max-tokens",
        "2",
        env={"HETERO_BLOK_SIZE": "8", "HETERO_EXECUTOR__MOCK__EOS_AFTER": "5"},
    )
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("hetero: warning:")]
    assert warnings == [
        "hetero: warning: unknown environment variable HETERO_BLOK_SIZE, ignored; "
        "did you mean HETERO_BLOCK_SIZE?"
    ]


def test_a_misspelt_setting_in_a_file_names_the_closest_one(tmp_path):
    config = tmp_path / "hetero.toml"
    config.write_text("max_tokns = 5\n")
    result = hetero("run", "--executor", "mock", "--config", str(config), "hi")
    assert result.returncode == 2
    assert "max_tokns: unknown setting; did you mean 'max_tokens'?" in result.stderr


def test_malformed_toml(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("block_size = [\n")
    result = hetero("run", "--config", str(config), "hi")
    assert result.returncode == 2 and "not valid TOML" in result.stderr and "Traceback" not in result.stderr


def test_unknown_flag_exits_2():
    result = hetero("run", "--no-such-flag", "hi")
    assert result.returncode == 2 and "unrecognized arguments" in result.stderr


def test_plugins_lists_core_the_three_executor_plugins_and_the_benchmarks():
    result = hetero("plugins")
    assert result.returncode == 0
    for expected in (
        "core (hetero-core",
        "mock (hetero-plugins-mock 0.1.0): loaded",
        "cuda (hetero-plugins-cuda 0.1.0): loaded",
        "triton (hetero-plugins-triton 0.1.0): loaded",
        "bench (hetero-bench 0.1.0): loaded\n    command: bench",
        "phi3 (hetero-model-phi3 0.1.0): loaded",
        "fair-share (hetero-policy-fair-share 0.1.0): loaded",
        "scheduler_policy: fcfs",
        "kv_allocator: paged",
    ):
        assert expected in result.stdout
    data = json.loads(hetero("plugins", "--json").stdout)
    assert {p["name"] for p in data} == {"core", "mock", "cuda", "triton", "bench", "phi3", "fair-share"}


def test_plugins_allow_list_flag():
    data = json.loads(hetero("plugins", "--json", "--plugins", "mock").stdout)
    status = {p["name"]: p["status"] for p in data}
    assert status == {
        "core": "loaded",
        "mock": "loaded",
        "cuda": "not allowed",
        "triton": "not allowed",
        "bench": "not allowed",
        "phi3": "not allowed",
        "fair-share": "not allowed",
    }


def test_help():
    assert hetero("--help").returncode == 0
    result = hetero("run", "--help")
    for flag in (
        "--max-num-blocks",
        "--memory-threshold",
        "--chat",
        "--no-chat",
        "--raw",
        "--verbose",
        "--executor",
        "--scheduler-policy",
        "--kv-allocator",
        "--tokenizer",
    ):
        assert flag in result.stdout
