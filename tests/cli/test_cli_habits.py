"""CLI habits users bring from vLLM and llm: --version, hetero chat, -s/--system, hetero settings, the
empty prompt refused alike everywhere, --output that would overwrite --input-file refused."""

from __future__ import annotations

import io
import json

import pytest

import hetero_core
from hetero_core.cli.chat import converse
from hetero_core.engine.requests.params import SamplingParams
from tests.cli_helpers import hetero


def test_version():
    result = hetero("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"hetero {hetero_core.__version__}"


def test_chat_keeps_the_conversation_and_leaves_on_end_of_input(make_mock_engine):
    engine = make_mock_engine({"eos_after": 4})
    seen = []
    add = engine.add_request
    engine.add_request = lambda prompt, params, **kw: seen.append(prompt) or add(prompt, params, **kw)
    out = io.StringIO()
    assert converse(engine, SamplingParams(max_tokens=8), "be brief", io.StringIO("hi\n\nthere\n"), out) == 0
    first, second = seen
    assert first == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    answer = out.getvalue().splitlines()[0]
    assert second == first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "there"}]


def test_hetero_chat_streams_answers_from_stdin():
    result = hetero(
        "chat",
        "--executor",
        "mock",
        "-s",
        "be brief",
        stdin="hi\nthere\n",
        env={"HETERO_EXECUTOR__MOCK__EOS_AFTER": "5"},
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2


def test_system_on_run_goes_before_the_prompt():
    with_system = hetero("run", "--executor", "mock", "--chat", "-s", "be brief", "hi", "--max-tokens", "2")
    without = hetero("run", "--executor", "mock", "--chat", "hi", "--max-tokens", "2")
    assert with_system.returncode == 0 and with_system.stdout != without.stdout  # a different prompt
    raw = hetero("run", "--executor", "mock", "--no-chat", "-s", "x", "hi")
    assert raw.returncode == 2 and "--system needs the chat template" in raw.stderr


def test_settings_shows_each_seam_and_its_plugin():
    result = hetero("settings", "--executor", "mock", "--max-tokens", "7")
    assert result.returncode == 0, result.stderr
    assert "  executor = mock: mock (hetero-plugins-mock" in result.stdout
    assert "  max_tokens = 7" in result.stdout
    data = json.loads(hetero("settings", "--executor", "mock", "--json").stdout)
    assert (
        data["seams"]["structured_output"]["name"] == "xgrammar"
        and data["seams"]["kv_allocator"]["plugin"] == "core"
    )


def test_settings_show_the_dtype_the_executor_gets(monkeypatch):
    from hetero_core.cli import show_settings

    data = json.loads(hetero("settings", "--executor", "torch", "--dtype", "bfloat16", "--json").stdout)
    assert (
        data["seams"]["executor"]["options"]["dtype"] == "bfloat16"
        and "dtype" not in data["seams"]["executor"]
    )
    monkeypatch.setattr("hetero_core.model.cpu.cpu_info.cpu_flags", lambda: frozenset({"avx2"}))
    assert show_settings.auto_dtype("torch", {"device": "cpu"}).startswith(
        "float32: this CPU has no native bf16"
    )
    monkeypatch.setattr("hetero_core.model.cpu.cpu_info.cpu_flags", lambda: frozenset({"avx512_bf16"}))
    assert show_settings.auto_dtype("torch", {"device": "cpu"}).startswith("decided when the executor starts")
    assert show_settings.auto_dtype("cuda", {}) == "decided when the executor starts"
    text = hetero("settings", "--executor", "torch").stdout
    assert '    dtype = "auto"  # ' in text


@pytest.mark.parametrize("args, message", [
    (["run", "--executor", "mock", ""], "hetero: error: the prompt is empty; give some text"),
    (["run", "--executor", "mock", "a", "  "], "hetero: error: prompt 2 is empty; give some text"),
])  # fmt: skip
def test_an_empty_prompt_is_one_refusal_before_any_engine(args, message):
    result = hetero(*args)
    assert result.returncode == 2 and result.stderr.strip() == message


def test_output_that_is_the_input_is_refused(tmp_path):
    batch = tmp_path / "p.jsonl"
    batch.write_text('{"id": "a", "prompt": "x"}\n')
    result = hetero(
        "run", "--executor", "mock", "--input-file", str(batch), "--output", str(tmp_path / "." / "p.jsonl")
    )
    assert result.returncode == 2 and "is the --input-file" in result.stderr
    assert batch.read_text() == '{"id": "a", "prompt": "x"}\n'
