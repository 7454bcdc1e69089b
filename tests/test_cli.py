"""The hetero command, run as a user would: a subprocess."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


def hetero(*args, env=None, timeout=120):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("HETERO_") or k == "HETERO_CACHE_DIR"}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "hetero_core", *args], capture_output=True, text=True, env=full_env, timeout=timeout
    )


def test_run_mock_prints_text_and_summary():
    result = hetero("run", "--executor", "mock", "你好，世界！", "--max-tokens", "12", "--temperature", "0")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip()) == 12
    assert "12 tokens in" in result.stderr and "tokens/s" in result.stderr


def test_run_mock_with_input_flags_and_config(tmp_path):
    config = tmp_path / "hetero.toml"
    config.write_text('max_tokens = 5\n[executor]\nname = "mock"\n[executor.mock]\neos_after = 3\n')
    result = hetero("run", "--config", str(config), "--input", "one", "--input", "two", "--log-format", "json")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("=== ") == 2
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    finished = [e for e in events if e["event"] == "request.finished"]
    assert len(finished) == 2 and {e["finish_reason"] for e in finished} == {"eos"}
    assert all(e["num_output_tokens"] == 3 for e in finished)


def test_mock_path_starts_fast_and_imports_no_torch():
    code = (
        "import sys, time; t = time.perf_counter(); "
        "from hetero_core.cli import main; "
        "rc = main(['run', '--executor', 'mock', 'hi', '--max-tokens', '4', '--log-level', 'error']); "
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', time.perf_counter() - t, file=sys.stderr)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "NO-TORCH" in result.stderr, result.stderr
    assert float(result.stderr.split("NO-TORCH")[1].split()[0]) < 1.0


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--executor", "cdua", "hi"], "unknown executor 'cdua'; available: cuda, mock, torch, triton"),
        (["run", "--executor", "mock", "--block-size", "-4", "hi"], "block_size: Input should be greater"),
        (["run", "--executor", "mock", "--memory-threshold", "1.5", "hi"], "memory_threshold"),
        (["run", "--executor", "mock", "--config", "/no/such/file.toml", "hi"], "settings file not found"),
        (["run", "--executor", "mock"], "no prompt given"),
        (["run", "--executor", "mock", "--top-p", "0", "hi"], "top_p"),
        (["run", "--executor", "triton", "hi"], "executor 'triton' cannot run here"),
        (["run", "--executor", "cuda", "hi"], "executor 'cuda' cannot run here: no CUDA device"),
        (["run", "--executor", "mock", "--config", str(DATA / "unknown-section.toml"), "hi"],
         "unknown executor 'mokc'"),
    ],
)
def test_user_mistakes_give_one_line_and_exit_2(args, message):
    result = hetero(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_malformed_toml(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("block_size = [\n")
    result = hetero("run", "--config", str(config), "hi")
    assert result.returncode == 2 and "not valid TOML" in result.stderr and "Traceback" not in result.stderr


def test_unknown_flag_exits_2():
    result = hetero("run", "--no-such-flag", "hi")
    assert result.returncode == 2 and "unrecognized arguments" in result.stderr


def test_plugins_lists_core_and_the_three_executor_plugins():
    result = hetero("plugins")
    assert result.returncode == 0
    for expected in ("core (hetero-core", "mock (hetero-plugins-mock 0.1.0): loaded",
                     "cuda (hetero-plugins-cuda 0.1.0): loaded", "triton (hetero-plugins-triton 0.1.0): loaded",
                     "scheduler_policy: fcfs", "kv_allocator: paged"):
        assert expected in result.stdout
    data = json.loads(hetero("plugins", "--json").stdout)
    assert {p["name"] for p in data} == {"core", "mock", "cuda", "triton"}


def test_plugins_allow_list_flag():
    data = json.loads(hetero("plugins", "--json", "--plugins", "mock").stdout)
    status = {p["name"]: p["status"] for p in data}
    assert status == {"core": "loaded", "mock": "loaded", "cuda": "not allowed", "triton": "not allowed"}


def test_help():
    assert hetero("--help").returncode == 0
    result = hetero("run", "--help")
    assert "--max-num-blocks" in result.stdout and "--memory-threshold" in result.stdout
