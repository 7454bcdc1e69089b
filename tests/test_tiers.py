"""The fast tier (``-m "not slow"``) and the per-file progress lines of ``-q`` (tests/tiers.py,
tests/progress_lines.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import tests.tiers as tiers

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "nodeid, fixtures",
    [
        ("tests/mock/test_mock_executor.py::test_tokens_depend_only_on_the_request", ["make_mock_engine"]),
        ("tests/testing/test_executor_contract_mock.py::TestMockExecutor::test_one_row[0]", ["executor"]),
        (
            "tests/model/test_kernel_contract.py::test_the_kv_write_takes_any_number_of_tokens[native]",
            ["kernels"],
        ),
        ("tests/server/test_server_openai.py::test_chat_completion", ["mock_server", "make_mock_engine"]),
        ("tests/testing/test_policy_contract.py::TestFairShare::test_budgets", []),
    ],
)
def test_the_mock_the_kernel_contract_the_server_on_the_mock_and_the_kits_are_fast(nodeid, fixtures):
    assert tiers.slow_reason(nodeid, fixtures) is None


def test_a_test_on_the_real_model_is_slow_through_any_fixture_that_needs_it():
    reason = tiers.slow_reason("tests/test_vllm_habits.py::test_x", ["llm", "smollm2_dir", "tmp_path"])
    assert reason == "loads the real SmolLM2 model"


@pytest.mark.parametrize("path", sorted(tiers.FAST_PATHS))
def test_every_fast_exception_exists_sits_in_a_slow_folder_and_still_yields_to_the_real_model(path):
    assert (ROOT / path).is_file(), f"tests/tiers.py names {path}, which is gone: remove it from FAST_PATHS"
    assert any(path.startswith(folder) for folder in tiers.SLOW_PATHS if folder.endswith("/"))
    assert tiers.slow_reason(f"{path}::test_y", ["smollm2_dir"]) == "loads the real SmolLM2 model"


@pytest.mark.parametrize("path", sorted(tiers.SLOW_PATHS))
def test_every_slow_path_exists_and_its_tests_are_slow(path):
    assert (ROOT / path).exists(), f"tests/tiers.py names {path}, which is gone: remove it from SLOW_PATHS"
    nodeid = f"{path}test_x.py::test_y" if path.endswith("/") else f"{path}::test_y"
    assert tiers.slow_reason(nodeid, []) == tiers.SLOW_PATHS[path]
    assert (ROOT / path).is_dir() == path.endswith("/"), f"{path}: a folder ends in '/', a file does not"


def test_a_folder_rule_does_not_catch_a_file_that_only_starts_like_it():
    assert all(
        tiers.slow_reason(f"{path.rstrip('/')}_more.py::test_y", []) is None
        for path in tiers.SLOW_PATHS
        if path.endswith("/")
    )


def test_the_fast_tier_is_declared_and_documented():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"slow: ' in pyproject
    for doc in ("README.md", "CONTRIBUTING.md"):
        assert '-m "not slow"' in (ROOT / doc).read_text(), f"{doc} does not name the fast tier's command"


SAMPLE = """
import pytest

def test_passes():
    pass

def test_fails():
    assert 1 == 2

@pytest.mark.skip(reason="not here")
def test_skipped():
    pass

@pytest.mark.parametrize("i", range(5))
def test_many(i):
    pass
"""


@pytest.fixture
def progress_run(pytester, monkeypatch):
    """Run pytest on a sample file with the progress plugin; returns its result."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(test_sample=SAMPLE, test_other="def test_one():\n    pass\n")

    def run(*args):
        return pytester.runpytest_subprocess("-p", "progress_lines", "-p", "no:cacheprovider", *args)

    return run


def test_quiet_runs_print_a_line_per_file_and_name_failures_at_once_then_pytests_closing_line(progress_run):
    result = progress_run("-q")
    out = result.stdout.str()
    assert "FAILED test_sample.py::test_fails (call)" in out
    assert re.search(r"\[ *\d+%\] +1/9 +\d+m\d\ds  test_other\.py: 1 passed \(", out), out
    assert re.search(r"\[100%\] 9/9 +\d+m\d\ds  test_sample\.py: 6 passed, 1 failed, 1 skipped \(", out), out
    assert not re.search(r"^[.Fs]+ *(\[|$)", out, re.MULTILINE), f"dots are still printed:\n{out}"
    assert re.search(r"^1 failed, 7 passed, 1 skipped in [\d.]+s", out.splitlines()[-1]), out
    assert result.ret == 1


def test_a_verbose_run_keeps_pytests_own_lines(progress_run):
    out = progress_run("-v").stdout.str()
    assert "test_sample.py::test_passes PASSED" in out and "6 passed, 1 failed" not in out


def test_under_xdist_the_lines_and_the_closing_line_are_the_same(progress_run):
    pytest.importorskip("xdist")
    result = progress_run("-q", "-n", "2")
    out = result.stdout.str()
    assert re.search(r"\[100%\] 9/9 .*: (6 passed, 1 failed, 1 skipped|1 passed) \(", out), out
    assert "test_sample.py: 6 passed, 1 failed, 1 skipped" in out and "test_other.py: 1 passed" in out
    assert re.search(r"^1 failed, 7 passed, 1 skipped in [\d.]+s", out.splitlines()[-1]), out
