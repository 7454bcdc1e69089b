"""Batch files (`hetero run --input-file F --output O`) end to end on the mock executor: results by
id, same text as offline generate, malformed lines, per-line sampling fields, OpenAI's batch
format in and out, resume, Ctrl-C, stdout output with progress on stderr."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from hetero_core.cli.main import main
from tests.cli_helpers import clean_env, hetero, hetero_command

MOCK = ("--executor", "mock")


def write_lines(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def read_results(path):
    text = path.read_text()
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def split_rows(results):
    """(result rows, {line number: error row of a malformed line})."""
    return [r for r in results if "line" not in r], {r["line"]: r for r in results if "line" in r}


def run_batch(tmp_path, records, *extra, capsys=None):
    source = write_lines(tmp_path / "in.jsonl", records)
    out = tmp_path / "out.jsonl"
    code = main(["run", *MOCK, "--input-file", str(source), "--output", str(out), *extra])
    return code, read_results(out) if out.exists() else None


PROMPTS = ["Hello there", "The sky is", "def f(x):", "1, 2, 3,", "Once upon a time"]


def test_every_line_answered_under_its_id_with_the_same_text_as_offline_generate(tmp_path):
    from hetero_core import LLM, SamplingParams

    records = [{"id": f"q{i}", "prompt": p, "max_tokens": 6} for i, p in enumerate(PROMPTS)]
    code, results = run_batch(tmp_path, records)
    assert code == 0
    by_id = {r["id"]: r for r in results}
    assert sorted(by_id) == sorted(f"q{i}" for i in range(len(PROMPTS)))
    llm = LLM(executor="mock")
    expected = llm.generate(PROMPTS, SamplingParams(max_tokens=6))
    for i, output in enumerate(expected):
        result = by_id[f"q{i}"]
        assert result["text"] == output.text
        assert result["num_prompt_tokens"] == len(output.prompt_token_ids)
        assert result["num_output_tokens"] == 6 and result["finish_reason"] == "length"
        assert "error" not in result


def test_a_malformed_lines_error_names_its_line_and_a_column_of_it(tmp_path, capsys):
    """Not ``line 2 column 1`` of a document: the line's own column (its newline is no part of it)."""
    code, results = run_batch(
        tmp_path, [{"prompt": "ok", "max_tokens": 2}, '{"prompt": "cut"', '{"prompt": x}']
    )
    err = capsys.readouterr().err
    assert code == 1
    _, bad = split_rows(results)
    assert bad[2]["error"] == "invalid JSON at the end of the line (column 17): Expecting ',' delimiter"
    assert "in.jsonl:3: skipped: invalid JSON at column 12: Expecting value" in err
    assert "line 1" not in err and "line 2 column" not in err


def test_id_defaults_to_the_line_number_and_per_line_max_tokens_is_honoured(tmp_path):
    code, results = run_batch(
        tmp_path, [{"prompt": "a", "max_tokens": 2}, "", {"prompt": [5, 6, 7], "max_tokens": 4}]
    )
    assert code == 0
    by_id = {r["id"]: r for r in results}
    assert set(by_id) == {1, 3}  # the blank line 2 is no request
    assert by_id[1]["num_output_tokens"] == 2 and by_id[3]["num_output_tokens"] == 4
    assert by_id[3]["num_prompt_tokens"] == 3


def test_malformed_lines_are_reported_with_their_line_number_and_the_rest_run(tmp_path, capsys):
    records = [
        {"id": "ok1", "prompt": "fine", "max_tokens": 2},
        "{not json",
        {"id": "typo", "prompt": "x", "max_tokenz": 3},
        {"id": "none"},
        {"id": "bad-temp", "prompt": "x", "temperature": -1},
        {"id": "ok2", "prompt": "also fine", "max_tokens": 2},
    ]
    code, results = run_batch(tmp_path, records)
    err = capsys.readouterr().err
    assert code == 1
    ran, bad = split_rows(results)
    assert sorted(r["id"] for r in ran) == ["ok1", "ok2"]
    assert {line: row["id"] for line, row in bad.items()} == {2: None, 3: "typo", 4: "none", 5: "bad-temp"}
    assert all(row["finish_reason"] is None and row["num_output_tokens"] == 0 for row in bad.values())
    assert bad[3]["error"].startswith("unknown sampling parameter 'max_tokenz'")
    assert "in.jsonl:2: skipped: invalid JSON" in err
    assert "in.jsonl:3: skipped: unknown sampling parameter 'max_tokenz' (did you mean 'max_tokens'?)" in err
    assert "in.jsonl:4: skipped: a line needs exactly one of 'prompt'" in err
    assert "in.jsonl:5: skipped: invalid sampling parameters: temperature must be >= 0" in err


def test_undecodable_bytes_and_a_line_of_the_other_format_are_skipped(tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_bytes(
        b'{"id": "ok", "prompt": "hi", "max_tokens": 1}\n{"prompt": "\xff\xfe"}\n'
        b'{"custom_id": "c", "url": "/v1/completions", "body": {"prompt": "x"}}\n'
    )
    out = tmp_path / "out.jsonl"
    assert main(["run", *MOCK, "--input-file", str(source), "--output", str(out)]) == 1
    ran, bad = split_rows(read_results(out))
    assert [r["id"] for r in ran] == ["ok"]
    assert {line: row["id"] for line, row in bad.items()} == {
        2: None,
        3: 3,
    }  # 3: the line number, the default id
    err = capsys.readouterr().err
    assert "in.jsonl:2: skipped: not UTF-8 text: 'utf-8' codec can't decode" in err
    assert "in.jsonl:3: skipped: an OpenAI batch line in a file of Hetero lines" in err


def test_a_request_the_engine_refuses_gets_an_error_result(tmp_path, capsys):
    code, results = run_batch(
        tmp_path, [{"id": "big", "prompt": [10**6]}, {"id": "ok", "prompt": "x", "max_tokens": 1}]
    )
    assert code == 1
    by_id = {r["id"]: r for r in results}
    assert "out of range" in by_id["big"]["error"] and by_id["big"]["finish_reason"] is None
    assert "error" not in by_id["ok"]
    assert "line 1 (id 'big') failed" in capsys.readouterr().err


def test_duplicate_ids_are_an_error_naming_both_lines(tmp_path, capsys):
    code, results = run_batch(
        tmp_path, [{"id": "x", "prompt": "a"}, {"prompt": "b"}, {"id": "x", "prompt": "c"}]
    )
    assert code == 2 and results is None  # nothing ran, no output file
    assert "duplicate id 'x' on lines 1 and 3" in capsys.readouterr().err


def test_openai_batch_format_in_and_out(tmp_path, capsys):
    from hetero_core.openai_api.protocol import ChatCompletionResponse, CompletionResponse

    records = [
        {
            "custom_id": "chat-1",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "any", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        },
        {
            "custom_id": "cmpl-1",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "any", "prompt": "Once", "max_tokens": 3, "n": 2},
        },
        {"custom_id": "emb", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},
        {
            "custom_id": "hot",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"prompt": "x", "temperature": 9},
        },
        {"custom_id": "far", "method": "POST", "url": "/v1/completions", "body": {"prompt": [10**6]}},
    ]
    code, results = run_batch(tmp_path, records)
    err = capsys.readouterr().err
    assert code == 1
    ran, bad = split_rows(results)
    by_id = {r["custom_id"]: r for r in ran}
    assert set(by_id) == {"chat-1", "cmpl-1", "far"}
    assert {line: row["custom_id"] for line, row in bad.items()} == {3: "emb", 4: "hot"}
    assert all(
        row["response"] == {"status_code": 400, "request_id": row["response"]["request_id"], "body": None}
        and row["error"]["code"] == 400
        for row in bad.values()
    )
    assert bad[3]["error"]["message"].startswith("unsupported 'url' '/v1/embeddings'")
    chat = by_id["chat-1"]
    assert chat["error"] is None and chat["response"]["status_code"] == 200 and chat["id"]
    body = ChatCompletionResponse.model_validate(chat["response"]["body"])
    assert body.usage.completion_tokens == 4 and body.choices[0].finish_reason == "length"
    completion = CompletionResponse.model_validate(by_id["cmpl-1"]["response"]["body"])
    assert len(completion.choices) == 2 and completion.usage.completion_tokens == 6
    far = by_id["far"]
    assert far["response"]["status_code"] == 400 and far["response"]["body"] is None
    assert "out of range" in far["error"]["message"]
    assert "in.jsonl:3: skipped: unsupported 'url' '/v1/embeddings'" in err
    assert "in.jsonl:4: skipped: invalid body for /v1/completions: temperature" in err


def test_openai_completion_text_matches_offline_generate(tmp_path):
    from hetero_core import LLM, SamplingParams

    records = [
        {
            "custom_id": str(i),
            "url": "/v1/completions",
            "method": "POST",
            "body": {"prompt": p, "max_tokens": 5, "temperature": 0},
        }
        for i, p in enumerate(PROMPTS)
    ]
    code, results = run_batch(tmp_path, records)
    assert code == 0
    expected = LLM(executor="mock").generate(PROMPTS, SamplingParams(max_tokens=5, temperature=0))
    for result in results:
        text = result["response"]["body"]["choices"][0]["text"]
        assert text == expected[int(result["custom_id"])].text


def test_resume_runs_only_the_missing_ids_and_drops_a_cut_off_last_line(tmp_path, capsys):
    records = [{"id": i, "prompt": f"prompt {i}", "max_tokens": 3} for i in range(6)]
    code, full = run_batch(tmp_path, records)
    assert code == 0
    out = tmp_path / "out.jsonl"
    kept = [r for r in full if r["id"] in (0, 2, 4)]
    out.write_text("".join(json.dumps(r) + "\n" for r in kept) + '{"id": 5, "te')  # killed mid-write
    code, resumed = run_batch(tmp_path, records, "--resume")
    assert code == 0
    assert "resuming: 3 of 6 requests already in" in capsys.readouterr().err
    assert resumed[:3] == kept
    assert sorted(r["id"] for r in resumed) == list(range(6))
    assert {r["id"]: r["text"] for r in resumed} == {r["id"]: r["text"] for r in full}


def test_output_to_stdout_is_only_result_lines(tmp_path):
    source = write_lines(
        tmp_path / "in.jsonl", [{"id": i, "prompt": "hi", "max_tokens": 2} for i in range(25)]
    )
    proc = hetero("run", *MOCK, "--input-file", str(source), "--output", "-")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert sorted(json.loads(line)["id"] for line in lines) == list(range(25))
    assert "hetero: batch 25/25 requests" in proc.stderr  # plain progress lines: stderr is not a terminal


def test_progress_bar_on_a_terminal_stays_off_stdout(tmp_path):
    pytest.importorskip("tqdm")
    pty = pytest.importorskip("pty")
    source = write_lines(
        tmp_path / "in.jsonl", [{"id": i, "prompt": "hi", "max_tokens": 2} for i in range(5)]
    )
    controller, terminal = pty.openpty()
    proc = subprocess.run(
        hetero_command("run", *MOCK, "--input-file", str(source), "--output", "-"),
        stdout=subprocess.PIPE,
        stderr=terminal,
        stdin=subprocess.DEVNULL,
        env=clean_env(),
        timeout=120,
        text=True,
    )
    os.close(terminal)
    shown = b""
    try:
        while chunk := os.read(controller, 65536):
            shown += chunk
    except OSError:
        pass
    os.close(controller)
    assert proc.returncode == 0
    assert sorted(json.loads(line)["id"] for line in proc.stdout.splitlines()) == list(range(5))
    assert b"5/5" in shown and b"req" in shown  # tqdm's bar, on the terminal


def test_ctrl_c_leaves_a_valid_file_and_exits_130(tmp_path):
    records = [{"id": i, "prompt": "x" * (i + 1), "max_tokens": 4 + 8 * i} for i in range(8)]
    source = write_lines(tmp_path / "in.jsonl", records)
    out = tmp_path / "out.jsonl"
    env = clean_env({"HETERO_EXECUTOR__MOCK__DECODE_LATENCY_PER_STEP": "0.05"})
    proc = subprocess.Popen(
        hetero_command("run", *MOCK, "--input-file", str(source), "--output", str(out)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (out.exists() and out.read_text().count("\n") >= 1):
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    done = read_results(out)
    assert 1 <= len(done) < len(records)
    code = main(["run", *MOCK, "--input-file", str(source), "--output", str(out), "--resume"])
    assert code == 0
    assert sorted(r["id"] for r in read_results(out)) == list(range(8))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--output", "o.jsonl"], "--output and --resume go with --input-file"),
        (["--input-file", "in.jsonl"], "--input-file needs --output FILE"),
        (["--input-file", "in.jsonl", "--output", "-", "--resume"], "'-' (stdout) cannot be resumed"),
        (["hi", "--input-file", "in.jsonl", "--output", "o"], "not both"),
        (["--input-file", "missing.jsonl", "--output", "o"], "cannot read --input-file missing.jsonl"),
        (["--input-file", "folder", "--output", "o"], "cannot read --input-file folder: Is a directory"),
        (
            ["--input-file", "in.jsonl", "--output", "folder"],
            "cannot write --output folder: it is a directory",
        ),
        (
            ["--input-file", "in.jsonl", "--output", "in.jsonl/o"],
            "cannot write --output in.jsonl/o: there is no folder",
        ),
    ],
)
def test_flag_mistakes_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    write_lines(tmp_path / "in.jsonl", [{"prompt": "x"}])
    assert main(["run", *MOCK, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.slow
def test_real_model_batch_file(tmp_path, smollm2_dir):
    from hetero_core import LLM, SamplingParams

    records = [
        {"id": "fr", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0, "logprobs": 2},
        {"id": "n", "prompt": "1, 2, 3,", "max_tokens": 3, "temperature": 0, "prompt_logprobs": 1},
    ]
    source = write_lines(tmp_path / "in.jsonl", records)
    out = tmp_path / "out.jsonl"
    assert main(["run", "--no-chat", "--input-file", str(source), "--output", str(out)]) == 0
    by_id = {r["id"]: r for r in read_results(out)}
    llm = LLM()
    try:
        expected = llm.generate(
            ["The capital of France is", "1, 2, 3,"],
            [SamplingParams(max_tokens=4, temperature=0), SamplingParams(max_tokens=3, temperature=0)],
        )
    finally:
        llm.shutdown()
    assert by_id["fr"]["text"] == expected[0].text and by_id["fr"]["num_output_tokens"] == 4
    assert by_id["n"]["text"] == expected[1].text
    logprobs = by_id["fr"]["logprobs"]
    assert [e["token_id"] for e in logprobs] == expected[0].output_token_ids
    for entry in logprobs:  # greedy: the chosen token is the most likely one
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 2
        assert entry["top_logprobs"][0]["token_id"] == entry["token_id"]
        assert entry["top_logprobs"][0]["logprob"] == pytest.approx(entry["logprob"], abs=1e-4)
    prompt = by_id["n"]["prompt_logprobs"]  # vLLM's shape: null, then {token id: Logprob} per prompt token
    assert "prompt_logprobs" not in by_id["fr"] and prompt[0] is None
    assert len(prompt) == by_id["n"]["num_prompt_tokens"] == len(expected[1].prompt_token_ids)
    for entry, token_id in zip(prompt[1:], expected[1].prompt_token_ids[1:]):
        assert str(token_id) in entry and min(v["rank"] for v in entry.values()) == 1
        assert entry[str(token_id)]["logprob"] <= 0
    openai_lines = [
        {
            "custom_id": "c",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"prompt": "1, 2, 3,", "max_tokens": 2, "temperature": 0, "prompt_logprobs": 0},
        }
    ]
    source = write_lines(tmp_path / "openai.jsonl", openai_lines)
    assert main(["run", "--no-chat", "--input-file", str(source), "--output", str(out)]) == 0
    [record] = read_results(out)
    prompt = record["response"]["body"]["choices"][0]["prompt_logprobs"]
    assert prompt[0] is None and [list(e) for e in prompt[1:]] == [
        [str(t)] for t in expected[1].prompt_token_ids[1:]
    ]


class _FakeTerminal:
    def __init__(self):
        self.text = ""

    def write(self, text):
        self.text += text

    def flush(self):
        pass

    def isatty(self):
        return True


def test_without_tqdm_a_terminal_gets_plain_progress_lines(monkeypatch):
    import sys

    from hetero_core.batch_files.progress import Progress

    monkeypatch.setitem(sys.modules, "tqdm", None)  # `import tqdm` now fails, as without the extra
    terminal = _FakeTerminal()
    progress = Progress(20, terminal)
    for _ in range(20):
        progress.update(1, 3)
    progress.close()
    lines = terminal.text.splitlines()
    assert lines[-1].startswith("hetero: batch 20/20 requests, 60 tokens")
    assert 10 <= len(lines) <= 20  # every tenth of the requests, not every one twice


def test_resume_refuses_a_file_that_is_not_results(tmp_path, capsys):
    source = write_lines(tmp_path / "in.jsonl", [{"prompt": "x"}])
    out = tmp_path / "out.jsonl"
    out.write_text("hello\n")
    assert main(["run", *MOCK, "--input-file", str(source), "--output", str(out), "--resume"]) == 2
    assert "cannot resume" in capsys.readouterr().err
    assert out.read_text() == "hello\n"


# -- logprobs ---------------------------------------------------------------------------------------
def test_native_lines_get_logprobs_when_they_ask(tmp_path):
    records = [
        {"id": "n", "prompt": "hi", "max_tokens": 3, "logprobs": 2},
        {"id": "chat-style", "prompt": "x", "max_tokens": 2, "logprobs": True, "top_logprobs": 1},
        {"id": "none", "prompt": "y", "max_tokens": 2},
    ]
    code, results = run_batch(tmp_path, records)
    assert code == 0
    by_id = {r["id"]: r for r in results}
    assert "logprobs" not in by_id["none"]
    for key, count in (("n", 3), ("chat-style", 2)):
        entries = by_id[key]["logprobs"]
        assert len(entries) == count == by_id[key]["num_output_tokens"]
        assert "".join(e["token"] for e in entries) == by_id[key]["text"]
        # the mock executor returns token ids, not logits: the tokens are there, their logprobs are not
        assert all(
            set(e) == {"token", "token_id", "logprob", "top_logprobs"} and e["logprob"] is None
            for e in entries
        )


def test_openai_lines_get_logprobs_in_the_servers_shape(tmp_path):
    from hetero_core.openai_api.protocol import ChatCompletionResponse, CompletionResponse

    records = [
        {
            "custom_id": "cmpl",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"prompt": "Once", "max_tokens": 3, "n": 2, "logprobs": 2},
        },
        {
            "custom_id": "chat",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4,
                "logprobs": True,
                "top_logprobs": 2,
            },
        },
        {
            "custom_id": "plain",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"prompt": "x", "max_tokens": 2},
        },
    ]
    code, results = run_batch(tmp_path, records)
    assert code == 0
    by_id = {r["custom_id"]: r["response"]["body"] for r in results}
    completion = CompletionResponse.model_validate(by_id["cmpl"])
    for choice in completion.choices:
        assert len(choice.logprobs.tokens) == len(choice.logprobs.token_logprobs) == 3
        assert "".join(choice.logprobs.tokens) == choice.text
        assert choice.logprobs.text_offset == [0, 1, 2]
    chat = ChatCompletionResponse.model_validate(by_id["chat"])
    assert len(chat.choices[0].logprobs.content) == chat.usage.completion_tokens == 4
    assert (
        "logprobs" not in by_id["plain"]["choices"][0]
    )  # not asked: not written (as the server leaves it out)


class _LogitsPlugin:
    """An executor that returns logits (the mock's token scores 3, the next id 2, the rest -5), so the
    sampler computes real logprobs: log_softmax of that row."""

    @staticmethod
    def executor(ctx):
        import torch

        from hetero_core.engine.scheduling.batch import ExecutorOutput
        from hetero_plugins_mock.executor import MockExecutor

        class LogitsExecutor(MockExecutor):
            def execute(self, batch):
                token_ids = super().execute(batch).token_ids
                logits = torch.full((len(token_ids), ctx.vocab_size), -5.0)
                for row, token in enumerate(token_ids):
                    logits[row, token], logits[row, token + 1] = 3.0, 2.0
                return ExecutorOutput(logits=logits)

        return LogitsExecutor(ctx)

    def __init__(self):
        from hetero_core.plugin_system.hookspecs import hookimpl

        @hookimpl
        def register_executors(register):
            register("logits", self.executor)

        self.register_executors = register_executors


class Records(list):
    """Stands in for a ``ResultWriter``: keeps the records written."""

    write = list.append


@pytest.mark.parametrize(
    "records",
    [
        [{"id": "n", "prompt": [5, 6, 7], "max_tokens": 3, "logprobs": 2}],
        [
            {
                "custom_id": "c",
                "url": "/v1/completions",
                "method": "POST",
                "body": {"prompt": [5, 6, 7], "max_tokens": 3, "logprobs": 2},
            },
            {
                "custom_id": "t",
                "url": "/v1/chat/completions",
                "method": "POST",
                "body": {
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 3,
                    "logprobs": True,
                    "top_logprobs": 2,
                },
            },
        ],
    ],
)
def test_logprob_values_reach_the_result_lines(records):
    import io
    import math

    torch = pytest.importorskip("torch")
    from hetero_core.batch_files.input_file import read_batch_file
    from hetero_core.builder import build_engine
    from hetero_core.cli.batch import BatchRunner
    from hetero_core.engine.requests.params import SamplingParams
    from hetero_core.plugin_system.discovery import load_plugins
    from hetero_core.settings import load_settings

    engine = build_engine(
        load_settings(executor="logits"),
        load_plugins(entry_points=[], extra_plugins=[("logits", _LogitsPlugin())]),
    )
    row = torch.full((engine.tokenizer.vocab_size,), -5.0)
    row[0], row[1] = 3.0, 2.0
    best, second = torch.log_softmax(row, 0)[:2].tolist()
    batch = read_batch_file(
        [json.dumps(r) for r in records],
        SamplingParams(temperature=0),
        chat=True,
        max_model_len=engine.max_model_len,
    )
    out = Records()
    assert BatchRunner(engine, batch.format, "m", io.StringIO()).run(batch.requests, out) == 0
    for result in out:
        if "custom_id" not in result:
            for entry in result["logprobs"]:
                assert math.isclose(entry["logprob"], best, rel_tol=1e-5)
                assert [t["token_id"] for t in entry["top_logprobs"]] == [
                    entry["token_id"],
                    entry["token_id"] + 1,
                ]
                assert math.isclose(entry["top_logprobs"][1]["logprob"], second, rel_tol=1e-5)
            continue
        choice = result["response"]["body"]["choices"][0]
        if "text_offset" in choice["logprobs"]:  # /v1/completions
            assert all(math.isclose(v, best, rel_tol=1e-5) for v in choice["logprobs"]["token_logprobs"])
            assert all(
                sorted(top.values()) == pytest.approx([second, best])
                for top in choice["logprobs"]["top_logprobs"]
            )
        else:
            for entry in choice["logprobs"]["content"]:
                assert math.isclose(entry["logprob"], best, rel_tol=1e-5)
                assert [t["logprob"] for t in entry["top_logprobs"]] == pytest.approx([best, second])


def test_logprobs_mistakes_fail_their_line(tmp_path, capsys):
    records = [
        {"id": "both", "prompt": "x", "logprobs": 3, "top_logprobs": 2},
        {"id": "top-alone", "prompt": "x", "top_logprobs": 2},
        {"id": "many", "prompt": "x", "logprobs": 99},
        {"custom_id": "o", "url": "/v1/completions", "body": {"prompt": "x"}},
        {"id": "ok", "prompt": "x", "max_tokens": 1, "logprobs": 0},
    ]
    code, results = run_batch(tmp_path, records)
    err = capsys.readouterr().err
    ran, bad = split_rows(results)
    assert code == 1 and [r["id"] for r in ran] == ["ok"] and sorted(bad) == [1, 2, 3, 4]
    assert ran[0]["logprobs"][0]["top_logprobs"] == []
    assert "in.jsonl:1: skipped: give 'logprobs': N (alternatives per token), or 'logprobs': true" in err
    assert "in.jsonl:2: skipped: 'top_logprobs' needs 'logprobs': true" in err
    assert "in.jsonl:3: skipped: invalid sampling parameters: logprobs must be in [0, 20], got 99" in err
