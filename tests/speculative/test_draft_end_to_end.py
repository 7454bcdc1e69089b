"""The ``draft`` proposer in the engine: greedy output with it is token for token the output without
speculation, with the embedded model as its own draft (nearly every proposal kept: the plumbing is
right), under preemption and chunked prefill, and for a random-weight target of the same tokenizer
(nearly nothing kept)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from hetero_core import LLM, SamplingParams  # noqa: E402

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "1, 2, 3, 4,",
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
]
DRAFT = {
    "speculative_proposer": {"name": "draft", "draft": {"dtype": "float32"}},
    "num_speculative_tokens": 4,
}
# a small Llama of SmolLM2's vocabulary with random weights (hetero_bench.random_models)
SMALL_TARGET = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 512,
}


def generate(model_dir, max_tokens: int = 16, **settings):
    llm = LLM(str(model_dir), "torch", dtype="float32", **settings)
    try:
        outputs = llm.generate(
            PROMPTS, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True), use_tqdm=False
        )
        return [o.output_token_ids for o in outputs], llm.engine.stats(), outputs
    finally:
        llm.shutdown()


def test_the_embedded_model_as_its_own_draft_keeps_the_output_and_nearly_every_proposal(smollm2_dir):
    expected, _, _ = generate(smollm2_dir)
    tokens, stats, _ = generate(smollm2_dir, **DRAFT)
    assert tokens == expected
    assert stats.spec_num_draft_tokens > 0
    assert stats.spec_num_accepted_tokens >= 0.9 * stats.spec_num_draft_tokens


def test_preemption_chunked_prefill_and_a_small_draft_pool_keep_the_output(smollm2_dir):
    # 12 blocks of 8 cannot hold every request: the target preempts, 48 tokens a step chunk the long
    # prompts, and the draft's own 12 blocks run out (those sequences get no proposal)
    tight = dict(block_size=8, max_num_blocks=12, max_total_tokens=48, memory_threshold=1.0)
    expected, _, _ = generate(smollm2_dir, **tight)
    tokens, stats, outputs = generate(smollm2_dir, **tight, **DRAFT)
    assert tokens == expected
    assert sum(o.num_preemptions for o in outputs) > 0 and stats.spec_num_accepted_tokens > 0


@pytest.fixture(scope="module")
def small_random_target(tmp_path_factory):
    from hetero_bench.random_models import resolve_random_model

    shape = tmp_path_factory.mktemp("shape") / "spec-small-target.json"
    shape.write_text(json.dumps(SMALL_TARGET))
    return resolve_random_model(f"random:{shape}:float32")  # made once in the cache, with SmolLM2's tokenizer


def test_a_random_target_with_the_embedded_draft_keeps_its_output(small_random_target):
    expected, _, _ = generate(small_random_target)
    tokens, stats, _ = generate(small_random_target, **DRAFT)
    assert tokens == expected
    assert stats.spec_num_draft_tokens > 0  # proposed and verified; random weights keep few, if any
