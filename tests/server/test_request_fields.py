"""Every field the request bodies accept does something: it reaches SamplingParams, or a named part of
the answer, or is refused by name. A new field must be placed here (the lists are pinned)."""

from __future__ import annotations

import pytest

from hetero_core.engine.requests.params import SamplingParams
from hetero_core.openai_api.convert import sampling_params
from hetero_core.openai_api.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest
from hetero_core.openai_api.tools import answer

# field -> a non-default value that SamplingParams must carry as given (or as the second value)
TO_SAMPLING = {
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 5,
    "min_p": 0.1,
    "repetition_penalty": 1.2,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "seed": 7,
    "ignore_eos": True,
    "stop": (["end"], ("end",)),
    "stop_token_ids": ([3], (3,)),
    "min_tokens": 2,
    "logit_bias": ({"5": 1.5}, ((5, 1.5),)),
    "bad_words": (["no"], ("no",)),
    "allowed_token_ids": ([1, 2], (1, 2)),
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "include_stop_str_in_output": True,
    "prompt_logprobs": 1,
}
GUIDED = {
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
}  # test_server_structured
ROUTED = {  # read by the routes (tests named in each comment)
    "model",  # 404 for another model (test_server_endpoints)
    "n",
    "best_of",  # choices (test_server_n_sharing, test_server_sampling_extras)
    "stream",
    "stream_options",  # server-sent events, usage chunk (test_server_openai)
    "max_tokens",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",  # passed per route (test_server_openai)
    "priority",
    "user",  # the engine's priority and tenant (test_server_openai)
    "prompt",
    "messages",
    "echo",  # the prompt (and its logprobs) first (test_server_echo, test_completions_echo_real_model)
    "tools",
    "tool_choice",
    "parallel_tool_calls",  # test_server_tools, and below
    "add_generation_prompt",
    "chat_template_kwargs",  # the chat template (test_server_sampling_extras)
}
REFUSED = {"suffix"}  # a 400 naming them when set (test_server_bad_input)


def test_every_request_field_is_placed():
    fields = set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)
    assert fields == set(TO_SAMPLING) | GUIDED | ROUTED | REFUSED


@pytest.mark.parametrize("name", sorted(TO_SAMPLING))
def test_sampling_fields_reach_sampling_params(name):
    given, expected = TO_SAMPLING[name] if isinstance(TO_SAMPLING[name], tuple) else (TO_SAMPLING[name],) * 2
    body = CompletionRequest.model_validate({"prompt": "x", name: given})
    params = sampling_params(body, SamplingParams(max_tokens=16), body.max_tokens, body.logprobs)
    assert getattr(params, name) == expected


def test_parallel_tool_calls_false_keeps_the_first_call_in_auto_mode():
    call = '<tool_call>{"name": "f", "arguments": {"i": %d}}</tool_call>'
    body = {
        "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "f"}}],
    }
    text = call % 1 + call % 2
    _, both = answer(text, ChatCompletionRequest.model_validate(body), "auto")
    _, first = answer(
        text, ChatCompletionRequest.model_validate({**body, "parallel_tool_calls": False}), "auto"
    )
    assert len(both) == 2 and [c.arguments for c in first] == ['{"i": 1}']


def test_a_messages_name_reaches_the_chat_template():
    assert ChatMessage(role="user", content="hi", name="ann").as_dict() == {
        "role": "user",
        "content": "hi",
        "name": "ann",
    }
    assert ChatMessage(role="developer", content="be brief").as_dict() == {
        "role": "system",
        "content": "be brief",
    }
