"""Code written with vLLM's habits runs on Hetero: the scripts below are what a vLLM user writes
(``from vllm import LLM, SamplingParams``, ``output.outputs[0].text``, ``SamplingParams(n=...)``,
``use_tqdm=False``, ``llm.chat(...)``, logprobs read as ``dict[int, Logprob]``); only the import is
different: a stand-in ``vllm`` module hands out Hetero's ``LLM`` (pinned to the test's model, as a
hub id cannot be fetched here) and ``SamplingParams``. They run on the mock executor and on the
embedded SmolLM2."""

from __future__ import annotations

import contextlib
import io
import sys
import types

import pytest

from hetero_core import LLM, SamplingParams

BASIC = """
from vllm import LLM, SamplingParams

prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=16)
llm = LLM(model="facebook/opt-125m")
outputs = llm.generate(prompts, sampling_params)
for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs[0].text
    print(f"Prompt: {prompt!r}, Generated text: {generated_text!r}")
"""

PARALLEL = """
from vllm import LLM, SamplingParams

llm = LLM(model="facebook/opt-125m")
params = SamplingParams(n=2, temperature=0, max_tokens=8)
outputs = llm.generate(["The capital of France is"], params, use_tqdm=False)
for output in outputs:
    print(len(output.outputs), output.num_cached_tokens, output.finished)
    for completion in output.outputs:
        print(completion.index, repr(completion.text), completion.finish_reason, completion.token_ids)
"""

LOGPROBS = """
from vllm import LLM, SamplingParams

llm = LLM(model="facebook/opt-125m")
params = SamplingParams(temperature=0, max_tokens=4, logprobs=2)
output = llm.generate("The capital of France is", params, use_tqdm=False)[0]
completion = output.outputs[0]
for token_id, position in zip(completion.token_ids, completion.logprobs):
    best = max(position.items(), key=lambda item: item[1].logprob)
    print(token_id, position[token_id].logprob, position[token_id].rank, best[0], len(position))
print(completion.cumulative_logprob)
"""

CHAT = """
from vllm import LLM, SamplingParams

llm = LLM(model="facebook/opt-125m")
sampling_params = SamplingParams(temperature=0, max_tokens=8)
conversation = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hello! How can I assist you today?"},
    {"role": "user", "content": "Write an essay about the importance of higher education."},
]
outputs = llm.chat(conversation, sampling_params, use_tqdm=False)
for output in outputs:
    print(f"Prompt: {output.prompt!r}, Generated text: {output.outputs[0].text!r}")
conversations = [conversation for _ in range(3)]
outputs = llm.chat(conversations, sampling_params, use_tqdm=True)
print(len({output.outputs[0].text for output in outputs}))
"""


def run(script: str, **llm_kwargs) -> str:
    """Run ``script`` with ``vllm`` standing for Hetero; its stdout."""
    built = []

    def vllm_llm(model=None, **kwargs):
        built.append(LLM(**{**kwargs, **llm_kwargs}))
        return built[-1]

    stand_in = types.ModuleType("vllm")
    stand_in.LLM, stand_in.SamplingParams = vllm_llm, SamplingParams
    saved = sys.modules.get("vllm")
    sys.modules["vllm"] = stand_in
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(script, "<vllm-style script>", "exec"), {"__name__": "__main__"})
    finally:
        for llm in built:
            llm.shutdown()
        if saved is None:
            del sys.modules["vllm"]
        else:
            sys.modules["vllm"] = saved
    return out.getvalue()


@pytest.fixture(params=["mock", "smollm2"])
def model(request):
    if request.param == "mock":
        return {"executor": "mock"}
    return {"model": str(request.getfixturevalue("smollm2_dir")), "executor": "torch"}


def test_the_basic_script(model, capsys):
    lines = run(BASIC, **model).splitlines()
    assert len(lines) == 4 and all(
        line.startswith("Prompt: '") and ", Generated text: " in line for line in lines
    )
    err = capsys.readouterr().err
    assert "Processed prompts: 100%" in err and "4/4" in err


def test_the_parallel_sampling_script_matches_single_runs(model):
    lines = run(PARALLEL, **model).splitlines()
    assert lines[0].split()[0] == "2" and lines[0].split()[2] == "True"
    with LLM(**model) as llm:
        [single] = llm.generate(
            "The capital of France is", SamplingParams(temperature=0, max_tokens=8), use_tqdm=False
        )
    for line in lines[1:]:
        assert line.endswith(str(single.output_token_ids)) and repr(single.text) in line


def test_the_chat_script(model, capsys):
    lines = run(CHAT, **model).splitlines()
    assert lines[0].startswith("Prompt: ") and lines[-1] == "1"  # greedy: three equal answers
    err = capsys.readouterr().err
    assert "Processed prompts: 100%" in err and "3/3" in err and "est. speed input:" in err


def test_the_logprobs_script_reads_vllm_logprob_dicts(smollm2_dir):
    lines = run(LOGPROBS, model=str(smollm2_dir), executor="torch").splitlines()
    total = 0.0
    for line in lines[:-1]:
        token_id, logprob, rank, best, size = line.split()
        assert token_id == best and rank == "1" and size == "2"  # greedy: the sampled token is the best
        total += float(logprob)
    assert float(lines[-1]) == pytest.approx(total)


def test_no_bar_without_tqdm(capsys):
    with LLM(executor="mock") as llm:
        llm.generate(["a", "b"], SamplingParams(max_tokens=2, n=2), use_tqdm=False)
        assert capsys.readouterr().err == ""
        llm.generate(["a", "b"], SamplingParams(max_tokens=2, n=2))
        assert "4/4" in capsys.readouterr().err  # one tick per completion, as vLLM counts


def test_chat_options_reach_the_template(smollm2_dir):
    with LLM(model=str(smollm2_dir), executor="torch") as llm:
        tokenizer = llm.get_tokenizer()
        messages = [{"role": "user", "content": "Hi"}]
        with_prompt = tokenizer.render_chat(messages)
        without = tokenizer.render_chat(messages, add_generation_prompt=False)
        assert with_prompt.startswith(without) and with_prompt != without
        [out] = llm.chat(messages, SamplingParams(max_tokens=2), use_tqdm=False, add_generation_prompt=False)
        assert out.prompt_token_ids == tokenizer.encode_chat(messages, add_generation_prompt=False)
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
        template = (
            "{% for t in tools %}{{ t.function.name }}{% endfor %}|{{ flavour }}|{{ messages[0].content }}"
        )
        tokenizer._template = _compile(template)
        [out] = llm.chat(
            messages,
            SamplingParams(max_tokens=2),
            use_tqdm=False,
            tools=tools,
            chat_template_kwargs={"flavour": "plain"},
        )
        assert out.prompt == "get_weather|plain|Hi"


def test_chat_options_a_tokenizer_cannot_take_are_refused():
    from hetero_core.errors import InvalidRequestError

    with LLM(executor="mock") as llm:
        with pytest.raises(InvalidRequestError, match="takes no chat option tools"):
            llm.chat([{"role": "user", "content": "Hi"}], tools=[{"type": "function"}])
        with pytest.raises(InvalidRequestError, match="chat_template_kwargs must be a dict"):
            llm.chat([{"role": "user", "content": "Hi"}], chat_template_kwargs=["x"])


def _compile(source):
    from hetero_core.default_plugins.hf_tokenizer import _compile_chat_template

    return _compile_chat_template(source)


def test_the_hf_tokenizer_shows_special_tokens_when_asked(smollm2_dir):
    from hetero_core.default_plugins.hf_tokenizer import HFTokenizer

    tokenizer = HFTokenizer(smollm2_dir)
    ids = tokenizer.encode("Hi") + [tokenizer.eos_token_id] + tokenizer.encode("there")
    eos = tokenizer.decode([tokenizer.eos_token_id], skip_special_tokens=False)
    assert eos.startswith("<|") and tokenizer.decode(ids) == "Hithere"
    assert tokenizer.decode(ids, skip_special_tokens=False) == f"Hi {eos} there"
    assert (
        tokenizer.decode(ids, skip_special_tokens=False, spaces_between_special_tokens=False)
        == f"Hi{eos}there"
    )
