"""OpenAI-format batch lines are converted as the server converts them: n (and best_of) completions as one
engine request sharing the prompt (SamplingParams(n=...)), vLLM's sampling extras, tools / tool_choice
with the server's parsing, and an error row (same custom_id) for every line that is not run."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_batch_file import run_batch, split_rows


def line(custom_id, url="/v1/completions", **body):
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def choices(result):
    return result["response"]["body"]["choices"]


def test_n_completions_are_the_engines_n_completions(tmp_path):
    from hetero_core import LLM, SamplingParams

    code, results = run_batch(
        tmp_path,
        [
            line("a", prompt="Once upon a time, far away", max_tokens=4, n=3, seed=5),
            line("b", prompt="Hi", max_tokens=4, n=1, seed=5),
        ],
    )
    assert code == 0
    by_id = {r["custom_id"]: r for r in results}
    [expected] = LLM(executor="mock").generate(
        ["Once upon a time, far away"], SamplingParams(max_tokens=4, n=3, seed=5)
    )
    assert [c["text"] for c in choices(by_id["a"])] == [c.text for c in expected.outputs]
    assert [c["index"] for c in choices(by_id["a"])] == [0, 1, 2]
    usage = by_id["a"]["response"]["body"]["usage"]
    assert usage["prompt_tokens"] == len(expected.prompt_token_ids) and usage["completion_tokens"] == 12
    assert len(choices(by_id["b"])) == 1


def test_best_of_returns_n_choices_and_below_n_is_an_error_row(tmp_path):
    code, results = run_batch(
        tmp_path,
        [
            line("best", prompt="Hello", max_tokens=3, n=2, best_of=3, seed=1),
            line("low", prompt="Hello", max_tokens=3, n=2, best_of=1),
        ],
    )
    ran, bad = split_rows(results)
    assert code == 1 and [len(choices(r)) for r in ran] == [2]
    assert bad[2]["custom_id"] == "low" and "best_of (1) must be at least n (2)" in bad[2]["error"]["message"]


def test_vllm_extras_reach_the_engine(tmp_path):
    from hetero_core import LLM, SamplingParams

    [plain] = LLM(executor="mock").generate(["Hello"], SamplingParams(max_tokens=6, temperature=0))
    stop_id = plain.output_token_ids[2]
    code, results = run_batch(
        tmp_path,
        [
            line("s", prompt="Hello", max_tokens=6, temperature=0, stop_token_ids=[stop_id]),
            line("m", prompt="Hello", max_tokens=6, min_tokens=9),
        ],
    )
    ran, bad = split_rows(results)
    assert choices(ran[0])[0]["text"] == plain.text[:2] and choices(ran[0])[0]["finish_reason"] == "stop"
    assert "min_tokens (9) must be at most max_tokens (6)" in bad[2]["error"]["message"]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"enum": ["UTC", "CET"]}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    }
]
CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "What time is it?"}]


def test_tools_in_chat_lines_are_called_as_the_server_calls_them(tmp_path):
    pytest.importorskip(
        "xgrammar", reason="named and required tool choice need: pip install 'hetero-core[structured]'"
    )
    named = {"type": "function", "function": {"name": "get_time"}}
    code, results = run_batch(
        tmp_path,
        [
            line("named", CHAT, messages=MESSAGES, tools=TOOLS, tool_choice=named, max_tokens=200),
            line("required", CHAT, messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=200),
            line(
                "both",
                CHAT,
                messages=MESSAGES,
                tools=TOOLS,
                tool_choice="required",
                response_format={"type": "json_object"},
            ),
            line(
                "unknown",
                CHAT,
                messages=MESSAGES,
                tools=TOOLS,
                tool_choice={"type": "function", "function": {"name": "nope"}},
            ),
        ],
    )
    ran, bad = split_rows(results)
    assert code == 1
    for result in ran:
        [choice] = choices(result)
        assert choice["finish_reason"] == "tool_calls" and choice["message"].get("content") is None
        calls = choice["message"]["tool_calls"]
        assert calls and (result["custom_id"] == "required" or len(calls) == 1)
        for call in calls:
            assert call["function"]["name"] == "get_time" and call["id"].startswith("call_")
            assert json.loads(call["function"]["arguments"])["zone"] in ("UTC", "CET")
    assert {row["custom_id"] for row in bad.values()} == {"both", "unknown"}
    assert "already fixes the output's format" in bad[3]["error"]["message"]
    assert "which is not in tools; available: get_time" in bad[4]["error"]["message"]


def test_auto_tools_put_the_functions_in_the_prompt(tmp_path):
    code, results = run_batch(
        tmp_path,
        [
            line("plain", CHAT, messages=MESSAGES, max_tokens=2),
            line("auto", CHAT, messages=MESSAGES, tools=TOOLS, max_tokens=2),
            line("none", CHAT, messages=MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=2),
        ],
    )
    usage = {r["custom_id"]: r["response"]["body"]["usage"]["prompt_tokens"] for r in results}
    assert code == 0 and usage["auto"] > usage["plain"] == usage["none"]


def test_chat_template_extras_in_chat_lines(tmp_path):
    code, results = run_batch(
        tmp_path,
        [
            line("with", CHAT, messages=MESSAGES, max_tokens=1),
            line("without", CHAT, messages=MESSAGES, max_tokens=1, add_generation_prompt=False),
            line("kwargs", CHAT, messages=MESSAGES, max_tokens=1, chat_template_kwargs={"x": 1}),
        ],
    )
    ran, bad = split_rows(results)
    usage = {r["custom_id"]: r["response"]["body"]["usage"]["prompt_tokens"] for r in ran}
    assert code == 1 and usage["with"] - usage["without"] == len("assistant: ")
    assert "takes no chat option chat_template_kwargs" in bad[3]["error"]["message"]


def test_echo_lines_answer_as_the_server(tmp_path):
    hello = {"prompt": "Hello there", "max_tokens": 3, "temperature": 0}
    code, results = run_batch(
        tmp_path,
        [
            line("plain", **hello),
            line("echo", **hello, echo=True),
            line("alone", prompt=["one", "two"], max_tokens=0, echo=True),
            line("zero", prompt="x", max_tokens=0),
        ],
    )
    ran, bad = split_rows(results)
    assert code == 1
    by_id = {r["custom_id"]: r for r in ran}
    plain, echoed, alone = (choices(by_id[i]) for i in ("plain", "echo", "alone"))
    assert echoed[0]["text"] == "Hello there" + plain[0]["text"]
    assert [c["text"] for c in alone] == ["one", "two"] and {c["finish_reason"] for c in alone} == {"length"}
    assert by_id["alone"]["response"]["body"]["usage"]["completion_tokens"] == 0
    assert "max_tokens 0 generates nothing: it needs echo" in bad[4]["error"]["message"]
