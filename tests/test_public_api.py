"""The public Python API: the names in hetero_core.__all__, the LLM facade, light imports."""

import subprocess
import sys

import pytest

import hetero_core
from hetero_core import LLM, ConfigError, InvalidRequestError, RequestOutput, SamplingParams
from hetero_core.engine.engine import Engine

PUBLIC_NAMES = [
    "__version__",
    "LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestMetrics",
    "HeteroSettings", "load_settings", "SettingsWarning",
    "HeteroError", "ConfigError", "PluginError", "UnknownComponentError", "InvalidRequestError",
    "ModelLoadError",
    "hookimpl", "AsyncLLM",
    "SchedulerPolicy", "SortKeyPolicy", "SchedulingDecision", "SchedulerSnapshot", "RequestView",
]  # fmt: skip


def test_public_names_are_pinned():
    assert hetero_core.__all__ == PUBLIC_NAMES
    for name in PUBLIC_NAMES:
        assert getattr(hetero_core, name) is not None
    assert set(PUBLIC_NAMES) <= set(dir(hetero_core))
    with pytest.raises(AttributeError, match="no attribute 'Engine'"):
        hetero_core.Engine  # noqa: B018 - reachable from hetero_core.engine.engine, not promised


def test_public_names_are_the_real_classes():
    from hetero_core.engine.requests.params import SamplingParams as DefinedSamplingParams
    from hetero_core.plugin_system.hookspecs import hookimpl

    assert SamplingParams is DefinedSamplingParams and hetero_core.hookimpl is hookimpl


def run_python(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_import_is_light_and_the_llm_needs_no_torch_on_the_mock():
    code = (
        "import sys, hetero_core; "
        "print('torch' in sys.modules, 'pydantic' in sys.modules, 'hetero_core.llm' in sys.modules); "
        "llm = hetero_core.LLM(executor='mock'); llm.generate('hi'); print('torch' in sys.modules)"
    )
    assert run_python(code).split() == ["False", "False", "False", "False"]


def test_builder_and_engine_do_not_import_each_other_or_the_facade():
    code = (
        "import sys; import hetero_core.engine.engine as e; print('hetero_core.builder' in sys.modules, "
        "hasattr(e.Engine, 'from_settings')); import hetero_core.builder; "
        "print('hetero_core.llm' in sys.modules)"
    )
    assert run_python(code).split() == ["False", "False", "False"]


@pytest.fixture
def llm():
    with LLM(executor="mock") as llm:
        yield llm


GREEDY = SamplingParams(temperature=0, max_tokens=6)


def test_generate_accepts_one_prompt_or_a_list_in_input_order(llm):
    one = llm.generate("hello", GREEDY)
    assert len(one) == 1 and isinstance(one[0], RequestOutput)
    many = llm.generate(["a", "hello", "b"], GREEDY)
    assert [o.prompt for o in many] == ["a", "hello", "b"]
    assert many[1].text == one[0].text and len(many[1].output_token_ids) == 6
    assert all(o.finished and o.finish_reason == "length" and o.error is None for o in many)


def test_generate_accepts_token_ids_and_vllm_prompt_dicts(llm):
    ids = list(b"hello")
    by_text = llm.generate("hello", GREEDY)[0]
    assert by_text.prompt_token_ids == ids
    for prompt in (ids, tuple(ids), {"prompt": "hello"}, {"prompt_token_ids": ids}):
        out = llm.generate(prompt, GREEDY)
        assert len(out) == 1 and out[0].text == by_text.text, prompt
    both = llm.generate([ids, [104, 105]], GREEDY)  # a list of token-id lists is several prompts
    assert [o.prompt_token_ids for o in both] == [ids, [104, 105]]
    assert llm.generate([], GREEDY) == []


def test_params_one_for_all_or_one_per_prompt(llm):
    outs = llm.generate(["a", "b"], [SamplingParams(max_tokens=2), SamplingParams(max_tokens=5)])
    assert [len(o.output_token_ids) for o in outs] == [2, 5]
    default = llm.generate("a")[0]  # the settings' defaults: greedy, 128 tokens
    assert len(default.output_token_ids) == 128
    with pytest.raises(InvalidRequestError, match="got 1 sampling params for 2 prompts"):
        llm.generate(["a", "b"], [GREEDY])
    with pytest.raises(InvalidRequestError, match="sampling_params must be a SamplingParams"):
        llm.generate("a", {"temperature": 0})
    with pytest.raises(InvalidRequestError, match=r"sampling_params\[1\] must be a SamplingParams, got dict"):
        llm.generate(["a", "b"], [GREEDY, {"temperature": 0}])
    with pytest.raises(InvalidRequestError, match="prompts must be a string"):
        llm.generate(42, GREEDY)


def test_a_bad_prompt_in_a_batch_fails_alone(llm):
    outs = llm.generate(["fine", {"text": "no such key"}, "also fine"], GREEDY)
    assert [o.failed for o in outs] == [False, True, False]
    assert "a prompt is" in outs[1].error


def test_outputs_carry_timings_and_a_metrics_view(llm):
    out = llm.generate("hi", GREEDY)[0]
    m = out.metrics
    assert m.arrival_time <= m.first_token_time <= m.finished_time
    assert m.time_to_first_token >= 0 and m.latency >= m.time_to_first_token
    assert (m.num_prompt_tokens, m.num_output_tokens) == (2, 6)


def test_chat_applies_the_template_to_one_or_several_conversations(llm):
    hello = [{"role": "user", "content": "hello"}]
    one = llm.chat(hello, GREEDY)
    assert len(one) == 1 and one[0].prompt == "user: hello\nassistant: "  # the byte tokenizer's template
    two = llm.chat([hello, [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]], GREEDY)
    assert two[0].text == one[0].text and two[1].prompt == "system: s\nuser: u\nassistant: "
    bad = llm.chat([hello, [{"role": "user"}]], GREEDY)
    assert not bad[0].failed and "content" in bad[1].error
    with pytest.raises(InvalidRequestError, match="conversation 1 must be a list of messages, got str"):
        llm.chat([hello, "hi"], GREEDY)
    with pytest.raises(InvalidRequestError, match="non-empty list of messages"):
        llm.chat("hi", GREEDY)


def test_settings_keywords_reach_the_engine_and_typos_name_the_closest_setting():
    with LLM(executor={"name": "mock", "mock": {"eos_after": 2}}, max_num_blocks=64, block_size=8) as llm:
        assert isinstance(llm.engine, Engine)
        assert (llm.engine.scheduler.allocator.num_blocks, llm.settings.block_size) == (64, 8)
        assert llm.generate("hi", GREEDY)[0].finish_reason == "eos"
    with pytest.raises(ConfigError, match="unknown setting 'blok_size'; did you mean 'block_size'?"):
        LLM(executor="mock", blok_size=8)


def test_executor_comes_from_settings_when_not_given(monkeypatch):
    monkeypatch.setenv("HETERO_EXECUTOR", "mock")
    with LLM() as llm:
        assert llm.settings.executor.name == "mock" and repr(llm) == (
            "LLM(model='smollm2-135m-instruct', executor='mock')"
        )
        assert llm.model_dir is None  # the mock runs no model


@pytest.mark.slow
def test_the_real_model_answers_a_chat_and_returns_logprobs(smollm2_dir):
    with LLM(model=str(smollm2_dir)) as llm:
        assert llm.has_chat_template and llm.model_dir == smollm2_dir
        params = SamplingParams(temperature=0, max_tokens=12, logprobs=2)
        chat, raw = (
            llm.chat([{"role": "user", "content": "What is the capital of France?"}], params)[0],
            llm.generate("What is the capital of France?", params)[0],
        )
        assert "Paris" in chat.text
        assert chat.prompt_token_ids != raw.prompt_token_ids  # the template was applied
        assert len(chat.logprobs) == len(chat.output_token_ids) and all(chat.logprobs)
