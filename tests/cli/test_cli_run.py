"""hetero run: streaming one prompt, batching several, stdin, chat by default, Ctrl-C."""

import io
import os
import select
import signal
import subprocess

import pytest

from hetero_core import LLM, SamplingParams
from hetero_core.cli.run import print_each_when_done, read_prompts, stream_one
from tests.cli_helpers import clean_env, default_sigint, hetero, hetero_command


def mock_llm(**settings):
    return LLM(executor="mock", **settings)


def test_one_prompt_prints_what_generate_returns():
    expected = mock_llm().generate("hi", SamplingParams(temperature=0, max_tokens=20))[0].text
    result = hetero("run", "--executor", "mock", "--max-tokens", "20", "hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected + "\n"


class ChunkRecorder(io.StringIO):
    def __init__(self):
        super().__init__()
        self.chunks = []

    def write(self, text):
        self.chunks.append(text)
        return super().write(text)


def test_streaming_writes_each_token_as_it_arrives():
    llm = mock_llm()
    params = SamplingParams(temperature=0, max_tokens=12)
    out = ChunkRecorder()
    final = stream_one(llm.engine, "hi", params, out)
    assert out.getvalue() == final.text + "\n"
    assert len(out.chunks) == 13  # one chunk per token (the mock's tokens are one character each), then "\n"


def test_streaming_holds_back_a_possible_stop_string_and_never_prints_it():
    llm = mock_llm()
    text = llm.generate("hi", SamplingParams(temperature=0, max_tokens=30))[0].text
    stop = text[10:13]
    cut = text.index(stop)  # the stop string's first occurrence
    out = ChunkRecorder()
    final = stream_one(llm.engine, "hi", SamplingParams(temperature=0, max_tokens=30, stop=[stop]), out)
    assert final.finish_reason == "stop" and final.text == text[:cut]
    assert out.getvalue() == text[:cut] + "\n"


def test_several_prompts_print_in_input_order_each_labelled():
    # With this mock seed "seven" ends (EOS) after 17 tokens and "three" after 4: the second is done
    # first but waits, and is printed right after the first.
    llm = LLM(executor={"name": "mock", "mock": {"eos_probability": 0.1}})
    params = SamplingParams(temperature=0, max_tokens=30)
    expected = llm.generate(["seven", "three"], params)
    assert [len(o.output_token_ids) for o in expected] == [17, 4]
    out = ChunkRecorder()
    outputs = print_each_when_done(llm.engine, ["seven", "three"], ["seven", "three"], params, out)
    assert [o.text for o in outputs] == [e.text for e in expected]
    assert out.getvalue() == f"=== [1] seven\n{expected[0].text}\n=== [2] three\n{expected[1].text}\n"


def test_a_failed_prompt_among_several_fails_alone_with_exit_1():
    result = hetero(
        "run", "--executor", "mock", "--max-model-len", "40", "--max-tokens", "8", "ok", "x" * 80, "fine"
    )
    assert result.returncode == 1, result.stderr
    labels = [line for line in result.stdout.splitlines() if line.startswith("=== ")]
    assert labels == ["=== [1] ok", f"=== [2] {'x' * 59}…", "=== [3] fine"]
    assert "hetero: request 2 failed:" in result.stderr and "Traceback" not in result.stderr


def test_prompt_from_stdin_dash_and_pipe():
    expected = hetero("run", "--executor", "mock", "--max-tokens", "8", "a question").stdout
    piped = hetero("run", "--executor", "mock", "--max-tokens", "8", stdin="a question\n")
    dash = hetero("run", "--executor", "mock", "--max-tokens", "8", "-", stdin="a question\n")
    assert piped.returncode == dash.returncode == 0
    assert piped.stdout == dash.stdout == expected


def test_read_prompts():
    assert read_prompts(["a", "-"], io.StringIO("from stdin\n")) == ["a", "from stdin"]
    assert read_prompts([], io.StringIO("piped")) == ["piped"]
    with pytest.raises(Exception, match="stdin was empty"):
        read_prompts(["-"], io.StringIO("  \n"))


def test_chat_template_is_used_only_when_the_model_has_one_unless_asked():
    # The mock runs with the byte tokenizer, which has no chat template: raw by default.
    llm = mock_llm()
    assert not llm.has_chat_template
    params = SamplingParams(temperature=0, max_tokens=10)
    raw = llm.generate("hi", params)[0].text
    chat = llm.chat([{"role": "user", "content": "hi"}], params)[0].text
    assert raw != chat
    assert hetero("run", "--executor", "mock", "--max-tokens", "10", "hi").stdout == raw + "\n"
    assert hetero("run", "--executor", "mock", "--max-tokens", "10", "--chat", "hi").stdout == chat + "\n"
    assert hetero("run", "--executor", "mock", "--max-tokens", "10", "--raw", "hi").stdout == raw + "\n"


def test_ctrl_c_stops_at_once_keeps_what_was_printed_and_exits_130():
    env = clean_env({"HETERO_EXECUTOR__MOCK__DECODE_LATENCY_PER_STEP": "0.1"})
    # 1000 tokens at 0.1 s each: only streaming can show text before the end, and only Ctrl-C ends it soon.
    proc = subprocess.Popen(
        hetero_command("run", "--executor", "mock", "--max-tokens", "1000", "hi"),
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
    printed = (first + rest).decode()
    full = mock_llm().generate("hi", SamplingParams(temperature=0, max_tokens=1000))[0].text
    assert 3 <= len(printed.rstrip("\n")) < len(full)
    assert full.startswith(printed.rstrip("\n"))
    assert "interrupted" in err.decode() and "Traceback" not in err.decode()


@pytest.mark.slow
def test_hetero_run_answers_a_question_with_the_defaults(smollm2_dir):
    result = hetero("run", "What is the capital of France?", timeout=600)
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    assert "Traceback" not in result.stderr and "request.finished" not in result.stderr


def test_one_prompt_that_cannot_fit_fails_with_exit_1_and_a_reason():
    result = hetero("run", "--executor", "mock", "--max-model-len", "16", "--max-tokens", "8", "x" * 20)
    assert result.returncode == 1 and result.stdout == ""
    assert "hetero: request failed:" in result.stderr and "max_model_len" in result.stderr
    assert result.stderr.count("failed") == 1  # reported once, not also as a log event
    assert "Traceback" not in result.stderr
