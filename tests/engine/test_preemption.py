"""Preemption by recompute and by swap on the mock executor: same tokens, counted, logged, no leaks."""

import logging

import pytest

from hetero_core.engine.requests.params import SamplingParams

PROMPTS = [f"request number {i} " * (1 + i % 5) for i in range(12)]


def greedy(max_tokens=24):
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def tiny_pool(make_mock_engine, mode, **kw):
    return make_mock_engine(max_num_blocks=32, block_size=4, memory_threshold=1.0, preemption_mode=mode, **kw)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("caching", [True, False])
def test_preempted_requests_finish_with_the_same_tokens(make_mock_engine, mode, caching):
    reference = make_mock_engine(max_num_blocks=1024, block_size=4).generate(PROMPTS, greedy())
    engine = tiny_pool(make_mock_engine, mode, enable_prefix_caching=caching)
    outputs = engine.generate(PROMPTS, greedy())
    stats = engine.stats()
    assert stats.num_preemptions > 0 and sum(o.num_preemptions for o in outputs) == stats.num_preemptions
    if mode == "swap":
        assert stats.num_swap_preemptions > 0 and stats.num_swap_ins == stats.num_swap_preemptions
    else:
        assert stats.num_swap_preemptions == 0
    assert [o.output_token_ids for o in outputs] == [o.output_token_ids for o in reference]
    assert engine.scheduler.allocator.num_free_blocks == 32
    if mode == "swap":
        assert engine.scheduler.preemptor.swap_space.num_free_blocks == 256


def test_swap_space_too_small_falls_back_to_recompute(make_mock_engine):
    engine = tiny_pool(make_mock_engine, "swap", num_swap_blocks=1)
    outputs = engine.generate(PROMPTS, greedy())
    stats = engine.stats()
    assert stats.num_recompute_preemptions > 0 and not any(o.failed for o in outputs)


def test_every_preemption_is_logged_with_its_mode(make_mock_engine, caplog):
    engine = tiny_pool(make_mock_engine, "swap")
    with caplog.at_level(logging.INFO, logger="hetero"):
        engine.generate(PROMPTS, greedy())
    lines = [r.getMessage() for r in caplog.records if "request.preempted" in r.getMessage()]
    assert len(lines) == engine.stats().num_preemptions
    assert all("mode" in line and "swap" in line for line in lines)


def test_aborting_a_swapped_request_frees_its_swap_blocks(make_mock_engine):
    engine = tiny_pool(make_mock_engine, "swap")
    ids = [engine.add_request(p, greedy()) for p in PROMPTS]
    scheduler = engine.scheduler
    while not scheduler.swapped:
        engine.step()
    victim = scheduler.swapped[0]
    assert engine.abort(victim.request_id)
    while engine.has_unfinished_requests():
        engine.step()
    assert scheduler.preemptor.swap_space.num_free_blocks == 256
    assert scheduler.allocator.num_free_blocks == 32
    assert victim.request_id in ids


def test_an_executor_without_swap_forces_recompute_with_a_startup_warning(caplog):
    from types import SimpleNamespace

    from hetero_core.engine.kv.block_transfer import block_transfer_options
    from hetero_core.executor import ExecutorCapabilities

    settings = SimpleNamespace(preemption_mode="swap", num_swap_blocks=64)
    plain = SimpleNamespace(capabilities=ExecutorCapabilities())  # declares neither copies nor swap
    with caplog.at_level(logging.WARNING, logger="hetero"):
        options = block_transfer_options(plain, "plain", settings)
    assert options == {"can_copy_blocks": False, "preemption_mode": "recompute", "num_swap_blocks": 0}
    assert "executor 'plain' does not declare block_swap" in caplog.text


def test_preemption_mode_is_validated():
    from hetero_core.errors import ConfigError
    from hetero_core.settings import load_settings

    with pytest.raises(ConfigError, match="preemption_mode"):
        load_settings(preemption_mode="drop")
