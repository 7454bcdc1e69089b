"""Speculative decoding (ngram) on the real embedded SmolLM2-135M with the torch executor: greedy output
is token for token the output without it, under continuous batching, chunked prefill, preemption
(recompute and swap), prefix hits, a stop string inside a kept run and max_tokens; ngram proposals
are kept on repetitive text.

Equality holds because the compiled CPU kernels are batch invariant (tests/model/test_batch_invariance.py):
a position's logits are the same bits whether it runs as a decode or inside a verified segment. On
the pure-torch path the two attention paths round differently and a near-tie may flip (as in vLLM),
so these tests need the kernels. The dtype is pinned: `auto` times its candidates per engine and two
engines of one test could pick different ones."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hetero_core.builder import build_engine  # noqa: E402
from hetero_core.engine.requests.params import SamplingParams  # noqa: E402
from hetero_core.plugin_system.discovery import load_plugins  # noqa: E402
from hetero_core.settings import load_settings  # noqa: E402

pytestmark = pytest.mark.slow

PROMPTS = [
    "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3,",
    "The cat sat on the mat. The cat sat on the mat. The cat",
    "def f(x):\n    return x + 1\n\ndef g(x):\n    return x + 1\n\ndef h(x):",
    "red, green, blue, red, green, blue, red,",
]
MAX_TOKENS = 32


def make_engine(smollm2_dir, k: int = 0, **overrides):
    settings = load_settings(
        model=str(smollm2_dir),
        executor="torch",
        chat=False,
        dtype="float32",
        num_speculative_tokens=k,
        **overrides,
    )
    engine = build_engine(settings, load_plugins(entry_points=[]))
    if engine.executor.backend.cpu_kernels is None:
        engine.shutdown()
        pytest.skip("greedy equality with speculation needs the compiled CPU kernels (batch invariant)")
    return engine


def greedy(max_tokens=MAX_TOKENS, **kw):
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kw)


@pytest.fixture(scope="module")
def reference(smollm2_dir):
    engine = make_engine(smollm2_dir)
    try:
        return engine.generate(PROMPTS, greedy())
    finally:
        engine.shutdown()


def tokens(outputs):
    return [(o.output_token_ids, o.finish_reason) for o in outputs]


@pytest.mark.parametrize(
    "k, setting",
    [
        (3, {}),
        (2, {"max_prefill_chunk": 8}),  # chunked prefill
        (4, {"max_num_blocks": 10, "preemption_mode": "recompute"}),
        (4, {"max_num_blocks": 10, "preemption_mode": "swap"}),
    ],
    ids=["batched", "chunked", "recompute", "swap"],
)
def test_greedy_output_equals_the_output_without_speculation(smollm2_dir, reference, k, setting):
    engine = make_engine(smollm2_dir, k, memory_threshold=1.0, **setting)
    try:
        outputs = engine.generate(PROMPTS, greedy())
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert tokens(outputs) == tokens(reference)
    assert stats.spec_num_accepted_tokens > stats.spec_num_draft_tokens / 4  # repetitive text: most are kept
    if "preemption_mode" in setting:
        assert stats.num_preemptions > 0


def test_requests_arriving_mid_run_and_prefix_hits(smollm2_dir, reference):
    engine = make_engine(smollm2_dir, 3)
    try:
        first = engine.generate(PROMPTS[:2], greedy())
        ids = [engine.add_request(PROMPTS[2], greedy())]
        engine.step()
        engine.step()
        ids.append(engine.add_request(PROMPTS[3], greedy()))
        finals = {}
        while len(finals) < 2:
            finals.update((o.request_id, o) for o in engine.step() if o.finished)
        again = engine.generate(PROMPTS[:2], greedy())  # served from the prefix cache
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert tokens(first + [finals[i] for i in ids]) == tokens(reference)
    assert tokens(again) == tokens(reference[:2]) and stats.prefix_cache_hit_tokens > 0


def test_a_stop_string_inside_a_kept_run_and_max_tokens(smollm2_dir, reference):
    stops = [greedy(stop=[o.text[6:9]]) for o in reference]  # a few tokens in, where proposals are kept
    short = greedy(max_tokens=5)
    plain = make_engine(smollm2_dir)
    try:
        stop_reference = plain.generate(PROMPTS, stops)
        short_reference = plain.generate(PROMPTS, short)
    finally:
        plain.shutdown()
    engine = make_engine(smollm2_dir, 4)
    try:
        stopped = engine.generate(PROMPTS, stops)
        cut = engine.generate(PROMPTS, short)
    finally:
        engine.shutdown()
    assert [(o.text, o.finish_reason) for o in stopped] == [(o.text, o.finish_reason) for o in stop_reference]
    assert tokens(stopped) == tokens(stop_reference) and any(o.finish_reason == "stop" for o in stopped)
    assert tokens(cut) == tokens(short_reference) and all(len(o.output_token_ids) == 5 for o in cut)


def test_sampled_requests_are_reproducible_with_a_seed(smollm2_dir):
    engine = make_engine(smollm2_dir, 3)
    try:
        params = SamplingParams(temperature=0.8, top_p=0.95, seed=7, max_tokens=24)
        first = engine.generate(PROMPTS, params)
        second = engine.generate(PROMPTS, params)
    finally:
        engine.shutdown()
    assert tokens(first) == tokens(second)
