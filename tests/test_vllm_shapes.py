"""vLLM's offline shapes in the engine: RequestOutput.outputs (CompletionOutput), num_cached_tokens,
stop_reason, and n > 1 / best_of completions that share the prompt's KV blocks (parallel_sampling)."""

from __future__ import annotations

import pytest

from hetero_core.engine.requests.params import SamplingParams
from hetero_core.errors import InvalidRequestError

PROMPT = "x" * 40  # byte tokenizer: 40 tokens, two full blocks of 16 and a partial one


def greedy(**kw):
    return SamplingParams(temperature=0, max_tokens=kw.pop("max_tokens", 6), **kw)


def test_one_completion_is_the_request_output_itself(make_mock_engine):
    engine = make_mock_engine()
    [out] = engine.generate([PROMPT], greedy())
    [completion] = out.outputs
    assert completion.index == 0 and completion.token_ids is out.output_token_ids
    assert completion.text == out.text and completion.finish_reason == "length" and completion.finished()
    assert completion.cumulative_logprob is None and completion.logprobs is None


def test_eos_is_a_stop_without_stop_reason_and_stops_name_themselves(make_mock_engine):
    engine = make_mock_engine({"eos_after": 3})
    [out] = engine.generate([PROMPT], greedy())
    assert out.finish_reason == "eos" and out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].stop_reason is None
    [plain] = make_mock_engine().generate([PROMPT], greedy())
    stop_id, stop_text = plain.output_token_ids[2], plain.text[3]
    [by_id] = make_mock_engine().generate([PROMPT], greedy(stop_token_ids=[stop_id]))
    assert by_id.outputs[0].stop_reason == stop_id
    [by_text] = make_mock_engine().generate([PROMPT], greedy(stop=[stop_text]))
    assert by_text.outputs[0].stop_reason == stop_text and by_text.outputs[0].finish_reason == "stop"


def test_min_tokens_lets_no_eos_or_stop_end_the_request_early(make_mock_engine):
    engine = make_mock_engine({"eos_after": 2})
    [out] = engine.generate([PROMPT], greedy(min_tokens=4))
    assert out.finish_reason == "eos" and len(out.output_token_ids) == 4
    [plain] = make_mock_engine().generate([PROMPT], greedy())
    [out] = make_mock_engine().generate([PROMPT], greedy(stop=[plain.text[0]], min_tokens=3))
    assert len(out.output_token_ids) > 3  # the stop string in the first 3 tokens' text does not count


def test_num_cached_tokens_counts_the_prefix_cache_hits(make_mock_engine):
    engine = make_mock_engine()
    [first] = engine.generate([PROMPT], greedy())
    [second] = engine.generate([PROMPT], greedy())
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 32


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_n_greedy_completions_equal_n_single_runs(make_mock_engine, prefix_caching):
    engine = make_mock_engine(enable_prefix_caching=prefix_caching)
    [single] = make_mock_engine().generate([PROMPT], greedy())
    outs = engine.generate([PROMPT, "short"], greedy(n=2))
    assert [c.index for c in outs[0].outputs] == [0, 1]
    assert [c.token_ids for c in outs[0].outputs] == [single.output_token_ids] * 2
    assert outs[0].output_token_ids == single.output_token_ids and outs[0].finished
    assert len(outs[1].outputs) == 2


def test_seeded_completions_use_seed_plus_index(make_mock_engine):
    outs = make_mock_engine().generate([PROMPT], SamplingParams(max_tokens=5, n=3, seed=7))
    singles = [
        make_mock_engine().generate([PROMPT], SamplingParams(max_tokens=5, seed=7 + i))[0] for i in range(3)
    ]
    assert [c.token_ids for c in outs[0].outputs] == [s.output_token_ids for s in singles]
    assert len({tuple(c.token_ids) for c in outs[0].outputs}) == 3


def test_n_completions_share_the_prompts_blocks(make_mock_engine):
    engine = make_mock_engine()
    allocator = engine.scheduler.allocator
    request_id = engine.add_request(PROMPT, greedy(n=3, max_tokens=4))
    engine.step()  # the first completion prefills the prompt alone
    assert [s.request_id for s in engine.scheduler.running] == [f"0_{request_id}"]
    prompt_blocks = list(engine.scheduler.running[0].block_table[:2])
    engine.step()  # the others join, from the prefix cache
    tables = [s.block_table for s in engine.scheduler.running]
    assert len(tables) == 3 and all(t[:2] == prompt_blocks for t in tables)
    assert [allocator.ref_count(b) for b in prompt_blocks] == [3, 3]
    assert len({t[2] for t in tables}) == 3  # the partial last block: each its own
    assert engine.stats().prefix_cache_hit_tokens == 2 * 32
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    [final] = [o for o in outputs if o.finished]
    assert final.request_id == request_id and final.num_cached_tokens == 64
    assert allocator.num_free_blocks == allocator.num_blocks


def test_aborting_the_request_ends_every_completion(make_mock_engine):
    engine = make_mock_engine()
    allocator = engine.scheduler.allocator
    request_id = engine.add_request(PROMPT, greedy(n=2, max_tokens=50))
    engine.step()
    assert engine.has_request(request_id) and engine.abort(request_id)
    outputs = engine.step()
    [final] = [o for o in outputs if o.request_id == request_id]
    assert final.finished and final.finish_reason == "abort"
    assert [c.finish_reason for c in final.outputs] == ["abort", "abort"]
    assert not engine.has_unfinished_requests() and not engine.has_request(request_id)
    assert allocator.num_free_blocks == allocator.num_blocks and not engine.abort(request_id)


def test_ids_of_a_request_and_its_completions_are_taken(make_mock_engine):
    engine = make_mock_engine()
    engine.add_request(PROMPT, greedy(n=2), request_id="r")
    for taken in ("r", "0_r", "1_r"):
        with pytest.raises(InvalidRequestError, match="already in use"):
            engine.add_request(PROMPT, greedy(), request_id=taken)


def test_best_of_returns_the_completions_of_best_cumulative_logprob(make_mock_engine):
    pytest.importorskip("torch")
    from tests.logits_executor import LogitsExecutor

    def engine():
        e = make_mock_engine()
        e.executor = LogitsExecutor(e.executor, e.tokenizer.vocab_size, margin=2.0)
        return e

    params = dict(temperature=1.0, max_tokens=5, seed=3)
    singles = [
        engine().generate([PROMPT], SamplingParams(**{**params, "seed": 3 + i}, logprobs=0))[0]
        for i in range(4)
    ]
    [out] = engine().generate([PROMPT], SamplingParams(**params, n=2, best_of=4))
    scores = sorted((s.outputs[0].cumulative_logprob, s.output_token_ids) for s in singles)[::-1]
    assert [c.token_ids for c in out.outputs] == [ids for _, ids in scores[:2]]
    assert [c.cumulative_logprob for c in out.outputs] == pytest.approx([lp for lp, _ in scores[:2]])
    assert out.outputs[0].logprobs is None and out.logprobs is None  # drawn for ranking only


def test_token_parameters_are_checked_against_the_vocabulary(make_mock_engine):
    engine = make_mock_engine()
    [out] = engine.generate([PROMPT], greedy(allowed_token_ids=[5, 999]))
    assert "outside the vocabulary" in out.error and "999" in out.error
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        engine.add_request(PROMPT, greedy(logit_bias={100000: 1.0}))


def test_bad_words_become_token_ids_at_the_start_and_after_a_space():
    from hetero_core.default_plugins.byte_tokenizer import ByteTokenizer
    from hetero_core.engine.requests.params_tokens import resolve_token_params

    params = resolve_token_params(SamplingParams(bad_words=["ab"]), ByteTokenizer())
    assert params.bad_words_token_ids == ((97, 98), (32, 97, 98))


def test_special_tokens_are_shown_when_asked():
    from hetero_core.default_plugins.byte_tokenizer import BOS_TOKEN_ID, ByteTokenizer
    from hetero_core.engine.requests.detokenizer import IncrementalDetokenizer

    shown = IncrementalDetokenizer(ByteTokenizer(), [65], SamplingParams(skip_special_tokens=False))
    assert shown.add(66) + shown.add(BOS_TOKEN_ID) + shown.add(67) + shown.flush() == "B <s> C"
    tight = IncrementalDetokenizer(
        ByteTokenizer(), [65], SamplingParams(skip_special_tokens=False, spaces_between_special_tokens=False)
    )
    assert tight.add(66) + tight.add(BOS_TOKEN_ID) + tight.add(67) + tight.flush() == "B<s>C"
    hidden = IncrementalDetokenizer(ByteTokenizer(), [65], SamplingParams())
    assert hidden.add(66) + hidden.add(BOS_TOKEN_ID) + hidden.add(67) + hidden.flush() == "BC"


def test_a_tokenizer_without_the_keyword_refuses_special_tokens():
    from hetero_core.engine.requests.params_tokens import resolve_token_params

    class Plain:
        vocab_size = 10

        def decode(self, ids):
            return ""

    with pytest.raises(InvalidRequestError, match="skip_special_tokens=False"):
        resolve_token_params(SamplingParams(skip_special_tokens=False), Plain())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n": 0}, "n must be in [1, 128], got 0"),
        ({"n": 3, "best_of": 2}, "best_of must be in [n, 128] (n = 3), got 2"),
        ({"min_tokens": 10, "max_tokens": 5}, "min_tokens (10) must be at most max_tokens (5)"),
        ({"logit_bias": {1: 101}}, "logit_bias values must be in [-100, 100], got 101 for token 1"),
        ({"logit_bias": {"one": 1}}, "logit_bias must be a dict of token id"),
        ({"allowed_token_ids": []}, "allowed_token_ids must not be empty"),
        ({"bad_words": [""]}, "bad_words must be non-empty words"),
        ({"skip_special_tokens": 1}, "skip_special_tokens must be true or false, got 1 (int)"),
        ({"prompt_logprobs": 21}, "prompt_logprobs must be in [0, 20], got 21"),
        ({"prompt_logprobs": -1}, "prompt_logprobs must be in [0, 20], got -1"),
    ],
)
def test_invalid_vllm_fields_are_named(kwargs, message):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**kwargs)
    assert message in str(info.value)


def test_vllm_fields_normalise_to_hashable_values():
    params = SamplingParams(logit_bias={"5": 1, 2: -1.5}, bad_words="no", allowed_token_ids=[3, 1])
    assert params.logit_bias == ((2, -1.5), (5, 1.0)) and params.bad_words == ("no",)
    assert params.allowed_token_ids == (3, 1) and hash(params) == hash(
        SamplingParams.from_dict(
            {"logit_bias": {5: 1, 2: -1.5}, "bad_words": ["no"], "allowed_token_ids": (3, 1)}
        )
    )


def test_prompt_logprobs_are_refused_by_name_on_an_executor_without_prompt_logits(make_mock_engine):
    engine = make_mock_engine()
    [out] = engine.generate([PROMPT], greedy(prompt_logprobs=1))
    assert "prompt_logprobs is not supported by the executor MockExecutor" in out.error
    with pytest.raises(InvalidRequestError, match="supports_prompt_logits"):
        engine.add_request(PROMPT, greedy(prompt_logprobs=0))
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("max_tokens", [1, 2])
def test_completions_that_start_after_the_first_ended_still_run(make_mock_engine, max_tokens):
    engine = make_mock_engine()
    [out] = engine.generate([PROMPT], greedy(n=3, max_tokens=max_tokens))
    assert out.finished and [len(c.token_ids) for c in out.outputs] == [max_tokens] * 3
    assert not engine.has_unfinished_requests()
    [out] = engine.generate(["ab"], greedy(n=2, max_tokens=1))  # no full block: nothing to share
    assert len({tuple(c.token_ids) for c in out.outputs}) == 1
    assert engine.abort("nonexistent") is False and engine.abort(["not", "an", "id"]) is False


def test_async_llm_refuses_several_completions_by_name(make_mock_engine):
    import asyncio

    from hetero_core import AsyncLLM

    async def first(llm):
        async for delta in llm.generate(PROMPT, greedy(n=2)):
            return delta

    with AsyncLLM(make_mock_engine()) as llm:
        with pytest.raises(InvalidRequestError, match="AsyncLLM streams one completion per request"):
            asyncio.run(first(llm))
