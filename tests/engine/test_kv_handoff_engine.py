"""Prefill/decode disaggregation inside the engine: a prefill engine exports a prompt's KV blocks, a
decode engine imports them and continues; the pair's output equals one engine's (mock executor: its
"K/V" are the token ids, read back through the block table, so a wrong block changes the output)."""

from __future__ import annotations

import pytest

from hetero_core.errors import InvalidRequestError
from hetero_core.kv_transfer import KVBlocks, KVHandoff

SETTINGS = {"block_size": 4, "max_num_blocks": 64, "max_model_len": 128, "max_tokens": 12}
PROMPTS = [list(range(10, 10 + n)) for n in (1, 3, 4, 5, 8, 11, 17)]


def prefill(engine, prompt, params):
    rid = engine.add_request(prompt, {**params, "max_tokens": 1}, export_kv=True, stream=False)
    while True:
        for o in engine.step():
            if o.request_id == rid and o.finished:
                return o


def decode(engine, prompt, params, first):
    rid = engine.add_request(
        prompt, params, stream=False, kv_transfer=KVHandoff(first.output_token_ids[0], first.kv_blocks)
    )
    while True:
        for o in engine.step():
            if o.request_id == rid and o.finished:
                return o


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_the_pair_gives_one_engines_tokens(make_mock_engine, prefix_caching):
    settings = {**SETTINGS, "enable_prefix_caching": prefix_caching}
    single, p_engine, d_engine = (make_mock_engine(**settings) for _ in range(3))
    params = {"max_tokens": 9, "ignore_eos": True}
    expected = single.generate(PROMPTS, params)
    for prompt, want in zip(PROMPTS, expected):
        first = prefill(p_engine, prompt, params)
        assert first.error is None and isinstance(first.kv_blocks, KVBlocks)
        assert first.kv_blocks.num_blocks == -(-len(prompt) // 4)
        got = decode(d_engine, prompt, params, first)
        assert got.error is None
        assert got.output_token_ids == want.output_token_ids
        assert got.text == want.text
    assert d_engine.scheduler.allocator.num_free_blocks == d_engine.scheduler.allocator.num_blocks
    if (
        prefix_caching
    ):  # the prompts share prefixes: the prefill side skipped cached blocks and still exported them
        assert p_engine.stats().prefix_cache_hit_tokens > 0


def test_decode_side_prefix_cache_skips_blocks_it_holds_and_registers_imported_ones(make_mock_engine):
    p_engine, d_engine = (
        make_mock_engine(**SETTINGS, enable_prefix_caching=True),
        make_mock_engine(**SETTINGS, enable_prefix_caching=True),
    )
    params = {"max_tokens": 4, "ignore_eos": True}
    prompt = list(range(20, 33))  # 13 tokens: 3 full blocks + 1
    first = prefill(p_engine, prompt, params)
    decode(d_engine, prompt, params, first)
    assert d_engine.scheduler.allocator.num_cached_blocks >= 3  # the imported full blocks are named
    # the same prompt again: its full blocks hit, only the last partial block is written
    imported = []
    inner = d_engine.executor.import_blocks
    d_engine.executor.import_blocks = lambda blocks, layers: (
        imported.append(len(blocks)),
        inner(blocks, layers),
    )
    again = decode(d_engine, prompt, params, prefill(p_engine, prompt, params))
    assert imported == [1] and again.error is None
    # and a plain request of the same prompt on the decode side hits the imported blocks
    stats_before = d_engine.stats().prefix_cache_hit_tokens
    d_engine.generate([prompt], params)
    assert d_engine.stats().prefix_cache_hit_tokens - stats_before >= 12


def test_a_first_token_that_ends_the_request_needs_no_decode_step(make_mock_engine):
    p_engine, d_engine = make_mock_engine(**SETTINGS), make_mock_engine(**SETTINGS)
    params = {"max_tokens": 1}
    first = prefill(p_engine, PROMPTS[3], params)
    out = decode(d_engine, PROMPTS[3], params, first)
    assert out.output_token_ids == first.output_token_ids and out.finish_reason == "length"
    assert d_engine.num_steps <= 1


def test_blocks_that_do_not_fit_are_refused_by_name(make_mock_engine):
    p_engine, d_engine = make_mock_engine(**SETTINGS), make_mock_engine(**{**SETTINGS, "block_size": 8})
    first = prefill(p_engine, PROMPTS[4], {})
    with pytest.raises(InvalidRequestError, match="block_size 4 but this engine's is 8"):
        d_engine.add_request(PROMPTS[4], {}, kv_transfer=KVHandoff(1, first.kv_blocks))
    same = make_mock_engine(**SETTINGS)
    with pytest.raises(InvalidRequestError, match="not the request's prompt"):
        same.add_request(PROMPTS[5], {}, kv_transfer=KVHandoff(1, first.kv_blocks))
    with pytest.raises(InvalidRequestError, match="n = 1"):
        same.add_request(PROMPTS[4], {"n": 2}, kv_transfer=KVHandoff(1, first.kv_blocks))
    assert not same.has_unfinished_requests()


def test_an_import_that_fails_fails_its_request_alone(make_mock_engine):
    p_engine, d_engine = make_mock_engine(**SETTINGS), make_mock_engine(**SETTINGS)
    first = prefill(p_engine, PROMPTS[4], {})
    bad = KVBlocks(
        4,
        0,
        ((first.kv_blocks.layers[0][0].__class__("int64", (9, 4), b"\0" * 8 * 36),),),
        first.kv_blocks.token_ids,
    )
    d_engine.add_request(PROMPTS[4], {"max_tokens": 5}, "bad", kv_transfer=KVHandoff(1, bad))
    outputs = {}
    while d_engine.has_unfinished_requests():
        outputs.update((o.request_id, o) for o in d_engine.step() if o.finished)
    assert "import" in outputs["bad"].error or "shape" in outputs["bad"].error
    good = decode(d_engine, PROMPTS[4], {"max_tokens": 5}, first)
    assert good.error is None and len(good.output_token_ids) >= 1


@pytest.mark.parametrize(
    "decode_settings",
    [
        {},
        {"max_num_blocks": 14, "memory_threshold": 1.0, "preemption_mode": "recompute"},
        {"max_num_blocks": 14, "memory_threshold": 1.0, "preemption_mode": "swap", "num_swap_blocks": 64},
        {"async_scheduling": True, "enable_prefix_caching": True},
    ],
    ids=["batched", "recompute", "swap", "async+prefix"],
)
def test_imports_arriving_among_running_requests_keep_every_output(make_mock_engine, decode_settings):
    """Handoffs added while other requests (plain and imported) decode, with preemption on the decode side."""
    params = {"max_tokens": 10, "ignore_eos": True}
    prompts = [list(range(40 + i, 40 + i + n)) for i, n in enumerate((6, 13, 2, 9, 17, 5, 11))]
    expected = {
        tuple(p): o.output_token_ids
        for p, o in zip(prompts, make_mock_engine(**SETTINGS).generate(prompts, params))
    }
    p_engine = make_mock_engine(**SETTINGS)
    d_engine = make_mock_engine(**{**SETTINGS, **decode_settings})
    firsts = [prefill(p_engine, prompt, params) for prompt in prompts]
    ids, outputs = {}, {}
    for i, (prompt, first) in enumerate(zip(prompts, firsts)):
        if i % 3 == 2:  # every third runs on the decode engine as a plain request
            ids[d_engine.add_request(prompt, params, stream=False)] = prompt
        else:
            ids[
                d_engine.add_request(
                    prompt,
                    params,
                    stream=False,
                    kv_transfer=KVHandoff(first.output_token_ids[0], first.kv_blocks),
                )
            ] = prompt
        for _ in range(2):  # the others decode a little before the next one arrives
            outputs.update((o.request_id, o) for o in d_engine.step() if o.finished)
    while d_engine.has_unfinished_requests():
        outputs.update((o.request_id, o) for o in d_engine.step() if o.finished)
    assert {rid: outputs[rid].error for rid in ids} == {rid: None for rid in ids}
    assert {rid: outputs[rid].output_token_ids for rid in ids} == {
        rid: expected[tuple(p)] for rid, p in ids.items()
    }
    if "preemption_mode" in decode_settings:
        assert d_engine.stats().num_preemptions > 0


def test_a_step_interrupted_before_its_import_prefills_the_prompt_instead(make_mock_engine):
    p_engine, d_engine = make_mock_engine(**SETTINGS), make_mock_engine(**SETTINGS)
    params = {"max_tokens": 6, "ignore_eos": True}
    expected = make_mock_engine(**SETTINGS).generate([PROMPTS[5]], params)[0].output_token_ids
    first = prefill(p_engine, PROMPTS[5], params)
    inner = d_engine.executor.import_blocks

    def interrupted(blocks, layers):
        d_engine.executor.import_blocks = inner
        raise KeyboardInterrupt

    d_engine.executor.import_blocks = interrupted
    rid = d_engine.add_request(
        PROMPTS[5], params, stream=False, kv_transfer=KVHandoff(first.output_token_ids[0], first.kv_blocks)
    )
    with pytest.raises(KeyboardInterrupt):
        d_engine.step()
    outputs = {}
    while d_engine.has_unfinished_requests():
        outputs.update((o.request_id, o) for o in d_engine.step() if o.finished)
    assert outputs[rid].error is None and outputs[rid].output_token_ids == expected
