"""Prompt logprobs on the real embedded SmolLM2-135M-Instruct, against HF transformers' forward."""

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hetero_core.builder import build_engine  # noqa: E402
from hetero_core.engine.requests.params import SamplingParams  # noqa: E402
from hetero_core.plugin_system.discovery import load_plugins  # noqa: E402
from hetero_core.settings import load_settings  # noqa: E402

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker who",
    "Hi",
]
TOLERANCE = 2e-3  # fp32 both sides, computed in a different order


@pytest.fixture(scope="module")
def hf_logprobs(smollm2_dir):
    """Per prompt: its token ids and HF's fp32 log_softmax at every position."""
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    results = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            logits = model(ids).logits[0].float()
        results.append((ids[0].tolist(), torch.log_softmax(logits, dim=-1)))
    return results


def make_engine(smollm2_dir, **overrides):
    settings = load_settings(model=str(smollm2_dir), **{"executor": "torch", "dtype": "float32", **overrides})
    return build_engine(settings, load_plugins(entry_points=[]))


def check_against_hf(outputs, hf_logprobs, k):
    """Each entry: the prompt token (logprob and rank as HF's) and the top k (HF's, best first)."""
    for out, (ids, expected) in zip(outputs, hf_logprobs):
        assert out.error is None, out.error
        assert out.prompt_token_ids == ids
        entries = out.prompt_logprobs
        assert len(entries) == len(ids) and entries[0] is None
        for position, (entry, token_id) in enumerate(zip(entries[1:], ids[1:]), start=1):
            row = expected[position - 1]
            want = row[token_id].item()
            assert math.isclose(entry[token_id].logprob, want, abs_tol=TOLERANCE)
            near = ((row - want).abs() < TOLERANCE).sum().item() - 1  # ties within tolerance may swap ranks
            assert abs(entry[token_id].rank - (int((row > want).sum()) + 1)) <= near
            top = sorted((lp.rank, lp.logprob) for t, lp in entry.items() if lp.rank <= k)
            assert [rank for rank, _ in top] == list(range(1, k + 1))
            assert len(entry) == k + (entry[token_id].rank > k)
            values = [value for _, value in top]
            assert values == sorted(values, reverse=True)
            for got, best in zip(values, row.topk(k).values.tolist()):
                assert math.isclose(got, best, abs_tol=TOLERANCE)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"max_total_tokens": 8},  # chunked prefill: 8 tokens a step
        {"max_prefill_chunk": 5, "enable_prefix_caching": True},
        {"max_total_tokens": 8, "async_scheduling": True},
    ],
    ids=["whole", "chunked", "chunked-small", "chunked-async"],
)
def test_prompt_logprobs_match_hf(smollm2_dir, hf_logprobs, overrides):
    engine = make_engine(smollm2_dir, **overrides)
    outputs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3))
    check_against_hf(outputs, hf_logprobs, 3)


def test_prompt_logprobs_with_zero_alternatives(smollm2_dir, hf_logprobs):
    engine = make_engine(smollm2_dir)
    outputs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))
    for out, (ids, _) in zip(outputs, hf_logprobs):
        assert [list(e) for e in out.prompt_logprobs[1:]] == [[t] for t in ids[1:]]


def test_prompt_logprobs_skip_the_prefix_cache(smollm2_dir, hf_logprobs):
    """A request asking for prompt logprobs computes its whole prompt, even when it is cached."""
    engine = make_engine(smollm2_dir, enable_prefix_caching=True, block_size=4)
    params = SamplingParams(temperature=0, max_tokens=2)
    engine.generate(PROMPTS, params)  # fills the prefix cache
    again = engine.generate(PROMPTS, params)
    assert again[1].num_cached_tokens > 0  # the cache serves plain requests
    outputs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2))
    assert [o.num_cached_tokens for o in outputs] == [0, 0, 0]
    check_against_hf(outputs, hf_logprobs, 2)
    # and the generated tokens are those of the plain request
    assert [o.output_token_ids for o in outputs] == [o.output_token_ids for o in again]


def test_prompt_logprobs_survive_preemption_by_recompute(smollm2_dir, hf_logprobs):
    engine = make_engine(
        smollm2_dir,
        block_size=8,
        max_num_blocks=10,
        max_total_tokens=40,
        memory_threshold=1.0,
        preemption_mode="recompute",
    )
    outputs = engine.generate(PROMPTS * 2, SamplingParams(temperature=0, max_tokens=24, prompt_logprobs=1))
    assert sum(o.num_preemptions for o in outputs) > 0
    check_against_hf(outputs, hf_logprobs * 2, 1)


def test_prompt_logprobs_off_leave_outputs_alone(smollm2_dir):
    engine = make_engine(smollm2_dir)
    plain = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=6))
    asked = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=6, prompt_logprobs=1))
    assert all(o.prompt_logprobs is None for o in plain)
    assert [o.output_token_ids for o in plain] == [o.output_token_ids for o in asked]


def test_prompt_logprobs_with_n_completions(smollm2_dir, hf_logprobs):
    engine = make_engine(smollm2_dir)
    outputs = engine.generate(
        PROMPTS, SamplingParams(n=2, temperature=0.8, seed=1, max_tokens=3, prompt_logprobs=1)
    )
    assert all(len(o.outputs) == 2 for o in outputs)
    check_against_hf(outputs, hf_logprobs, 1)
