"""Tensor parallelism end to end on the CPU (gloo): spawned workers, the same greedy tokens as one
rank, and a worker that dies or raises failing the engine at once with an error naming its rank."""

from __future__ import annotations

import os
import signal
import threading

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from hetero_core.builder import build_engine  # noqa: E402
from hetero_core.engine.requests.params import SamplingParams  # noqa: E402
from hetero_core.errors import ConfigError, ExecutorDeadError  # noqa: E402
from hetero_core.plugin_system.discovery import load_plugins  # noqa: E402
from hetero_core.settings import load_settings  # noqa: E402

SYSTEM = [5, 17, 33, 2, 48, 71, 9, 64, 12, 88, 40, 3, 27, 55, 61, 19, 7, 90, 14, 36]  # 20 tokens
PROMPTS = [SYSTEM + [10 + i, 20 + i, 30 + i] * (1 + i % 3) for i in range(5)]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    from tests.model.tiny_models import save_tiny_model

    root = tmp_path_factory.mktemp("tp_engine")
    for name in ("llama", "qwen3"):
        save_tiny_model(name, root / name)
    return root


def make_engine(model_dir, plugins=None, **overrides):
    settings = load_settings(
        model=str(model_dir), tokenizer="byte", block_size=4, max_model_len=128, **overrides
    )
    return build_engine(settings, plugins or load_plugins(entry_points=[]))


def greedy_tokens(model_dir, prompts=PROMPTS, params=GREEDY, **overrides):
    engine = make_engine(model_dir, **overrides)
    try:
        return [o.output_token_ids for o in engine.generate(prompts, params)]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("model", ["llama", "qwen3"])  # qwen3: per-head q/k norms, head_dim != hidden/heads
def test_two_ranks_give_the_greedy_tokens_of_one(tiny_dirs, model):
    assert greedy_tokens(tiny_dirs / model, tensor_parallel_size=2) == greedy_tokens(tiny_dirs / model)


def test_block_copies_and_swaps_reach_every_rank(tiny_dirs):
    """A pool small enough to swap sequences out and back, and a shared prefix whose last block is
    copied on write: wrong KV heads on any rank would change the tokens."""
    tight = dict(max_num_blocks=24, memory_threshold=1.0, preemption_mode="swap", num_swap_blocks=64)
    reference = greedy_tokens(tiny_dirs / "llama", **tight)
    engine = make_engine(tiny_dirs / "llama", tensor_parallel_size=2, **tight)
    try:
        got = [o.output_token_ids for o in engine.generate(PROMPTS, GREEDY)]
        again = engine.generate([PROMPTS[0]], GREEDY)[0].output_token_ids  # its whole prompt is cached
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert got == reference and again == reference[0]
    assert stats.num_swap_preemptions > 0 and stats.prefix_cache_hit_tokens > 0


@pytest.mark.slow
def test_three_ranks_on_smollm2_give_the_greedy_tokens_of_one(smollm2_dir):
    prompts = ["The capital of France is", "def fibonacci(n):", "你好，世界！"]
    params = SamplingParams(temperature=0, max_tokens=12)
    outputs = {}
    for size in (1, 3):
        settings = load_settings(model=str(smollm2_dir), executor="torch", tensor_parallel_size=size)
        engine = build_engine(settings, load_plugins(entry_points=[]))
        try:
            outputs[size] = [o.output_token_ids for o in engine.generate(prompts, params)]
        finally:
            engine.shutdown()
    assert outputs[3] == outputs[1]
    assert all(len(tokens) > 3 for tokens in outputs[1])


def test_smollm2_refuses_two_ranks_before_starting_any(smollm2_dir):
    settings = load_settings(model=str(smollm2_dir), executor="torch", tensor_parallel_size=2)
    with pytest.raises(
        ConfigError, match="tensor_parallel_size 2 does not divide the model's num_attention_heads 9"
    ):
        build_engine(settings, load_plugins(entry_points=[]))


@pytest.mark.parametrize("when", ["between steps", "during a step"])
def test_a_killed_worker_fails_the_engine_naming_its_rank(tiny_dirs, when):
    engine = make_engine(tiny_dirs / "llama", tensor_parallel_size=2)
    try:
        for prompt in PROMPTS:
            engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=90, ignore_eos=True))
        for _ in range(3):
            engine.step()
        (worker,) = engine.executor.worker_pids
        if when == "between steps":
            os.kill(worker, signal.SIGKILL)
        else:
            threading.Timer(0.02, os.kill, (worker, signal.SIGKILL)).start()
        with pytest.raises(ExecutorDeadError) as error:
            for _ in range(500):  # a step takes milliseconds: the kill lands long before the end
                engine.step()
        assert "tensor-parallel worker rank 1 died: killed by SIGKILL" in str(error.value)
        with pytest.raises(ExecutorDeadError, match="rank 1"):  # and the engine stays stopped
            engine.step()
    finally:
        engine.shutdown()


@pytest.mark.parametrize("rank", [1, 0])
def test_an_exception_on_any_rank_fails_the_engine_with_it(tiny_dirs, rank):
    import tests.distributed.tp_faults as tp_faults

    plugins = load_plugins(entry_points=[], extra_plugins=[("faulty", tp_faults)])
    engine = make_engine(
        tiny_dirs / "llama",
        plugins,
        tensor_parallel_size=2,
        executor={"name": "faulty", "faulty": {"rank": rank, "after": 2}},
    )
    try:
        with pytest.raises(ExecutorDeadError) as error:
            engine.generate(PROMPTS, GREEDY)
        where = "worker rank 1 failed" if rank else "rank 0 failed"
        assert f"tensor-parallel {where}: RuntimeError: injected fault on rank {rank}" in str(error.value)
    finally:
        engine.shutdown()


def test_two_ranks_give_the_prompt_logprobs_of_one(tiny_dirs):
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2)

    def prompt_logprobs(**overrides):
        engine = make_engine(tiny_dirs / "llama", max_total_tokens=16, dtype="float32", **overrides)
        try:
            return [o.prompt_logprobs for o in engine.generate(PROMPTS[:2], params)]
        finally:
            engine.shutdown()

    one, two = prompt_logprobs(), prompt_logprobs(tensor_parallel_size=2)
    for a, b, prompt in zip(one, two, PROMPTS):
        assert len(a) == len(b) == len(prompt) and a[0] is None and b[0] is None
        for x, y, token_id in zip(a[1:], b[1:], prompt[1:]):
            assert abs(x[token_id].logprob - y[token_id].logprob) < 1e-3  # the prompt token's, on both
            assert len(y) == 2 + (y[token_id].rank > 2)
