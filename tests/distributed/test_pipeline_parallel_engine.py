"""Pipeline parallelism end to end on the CPU (gloo): stages in worker processes give the greedy
tokens of one process (fp32), with chunked prefill, prefix caching and preemption on, composed with
tensor parallelism; a stage that dies fails the engine at once with one line naming it."""

from __future__ import annotations

import os
import signal

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from hetero_core.builder import build_engine  # noqa: E402
from hetero_core.engine.requests.params import SamplingParams  # noqa: E402
from hetero_core.errors import ExecutorDeadError  # noqa: E402
from hetero_core.plugin_system.discovery import load_plugins  # noqa: E402
from hetero_core.settings import load_settings  # noqa: E402

SYSTEM = [5, 17, 33, 2, 48, 71, 9, 64, 12, 88, 40, 3, 27, 55, 61, 19, 7, 90, 14, 36]  # 20 tokens
PROMPTS = [SYSTEM + [10 + i, 20 + i, 30 + i] * (1 + i % 3) for i in range(5)]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
# chunked prefill (8-token chunks), a pool small enough to swap sequences out and back, and a shared
# prefix whose last block is copied on write: a stage with the wrong layers' KV would change tokens
TIGHT = dict(
    max_prefill_chunk=8, max_num_blocks=24, memory_threshold=1.0, preemption_mode="swap", num_swap_blocks=64
)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    from tests.model.tiny_models import save_tiny_model

    root = tmp_path_factory.mktemp("pp_engine")
    for name in ("llama", "qwen3", "llama_mqa_tied"):
        save_tiny_model(name, root / name)
    return root


def make_engine(model_dir, **overrides):
    settings = load_settings(
        model=str(model_dir), tokenizer="byte", block_size=4, max_model_len=128, dtype="float32", **overrides
    )
    return build_engine(settings, load_plugins(entry_points=[]))


def greedy_tokens(model_dir, prompts=PROMPTS, **overrides):
    engine = make_engine(model_dir, **overrides)
    try:
        return [o.output_token_ids for o in engine.generate(prompts, GREEDY)]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("model", ["llama", "qwen3", "llama_mqa_tied"])  # own LM head; q/k norms; tied
def test_two_stages_give_the_greedy_tokens_of_one(tiny_dirs, model):
    assert greedy_tokens(tiny_dirs / model, pipeline_parallel_size=2) == greedy_tokens(tiny_dirs / model)


def test_stages_of_two_tensor_parallel_ranks_give_the_greedy_tokens_of_one(tiny_dirs):
    got = greedy_tokens(tiny_dirs / "llama", pipeline_parallel_size=2, tensor_parallel_size=2)
    assert got == greedy_tokens(tiny_dirs / "llama")


def test_two_steps_of_disjoint_sequences_are_in_flight_at_once(tiny_dirs):
    """While the last stage finishes step t, stage 0 starts step t+1, of other sequences (vLLM's
    virtual engines): no sequence whose token step t samples is in step t+1; greedy tokens unchanged."""
    engine = make_engine(tiny_dirs / "llama", pipeline_parallel_size=2)
    overlaps = []
    run_pipelined = engine.driver.run_pipelined

    def watched(scheduled, *args):
        if scheduled.batch is not None:
            for step, _ in engine.driver.in_flight:  # started, not finished: still in the pipeline
                sampled = {s.seq_id for s, flag in zip(step.seqs, step.batch.sample) if flag}
                overlaps.append(sampled & {s.seq_id for s in scheduled.seqs})
        return run_pipelined(scheduled, *args)

    engine.driver.run_pipelined = watched
    try:
        assert engine.pipelined_steps
        got = [o.output_token_ids for o in engine.generate(PROMPTS, GREEDY)]
    finally:
        engine.shutdown()
    assert len(overlaps) > len(PROMPTS)  # steps started while another was in flight, many times
    assert all(not common for common in overlaps)
    assert got == greedy_tokens(tiny_dirs / "llama")


def test_async_scheduling_off_runs_one_step_at_a_time(tiny_dirs):
    engine = make_engine(tiny_dirs / "llama", pipeline_parallel_size=2, async_scheduling=False)
    try:
        assert not engine.pipelined_steps and not engine.async_scheduling
        got = [o.output_token_ids for o in engine.generate(PROMPTS, GREEDY)]
    finally:
        engine.shutdown()
    assert got == greedy_tokens(tiny_dirs / "llama")


def test_chunked_prefill_swaps_and_block_copies_reach_every_stage(tiny_dirs):
    reference = greedy_tokens(tiny_dirs / "llama", **TIGHT)
    engine = make_engine(tiny_dirs / "llama", pipeline_parallel_size=2, **TIGHT)
    try:
        got = [o.output_token_ids for o in engine.generate(PROMPTS, GREEDY)]
        again = engine.generate([PROMPTS[0]], GREEDY)[0].output_token_ids  # its whole prompt is cached
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert got == reference and again == reference[0]
    assert stats.num_swap_preemptions > 0 and stats.prefix_cache_hit_tokens > 0


def test_prompt_logprobs_come_from_the_last_stage(tiny_dirs):
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2)

    def prompt_logprobs(**overrides):
        engine = make_engine(tiny_dirs / "llama", max_total_tokens=16, **overrides)
        try:
            return [o.prompt_logprobs for o in engine.generate(PROMPTS[:2], params)]
        finally:
            engine.shutdown()

    one, two = prompt_logprobs(), prompt_logprobs(pipeline_parallel_size=2)
    for a, b, prompt in zip(one, two, PROMPTS):
        assert len(a) == len(b) == len(prompt)
        for x, y, token_id in zip(a[1:], b[1:], prompt[1:]):
            assert abs(x[token_id].logprob - y[token_id].logprob) < 1e-4


def test_a_killed_stage_fails_the_engine_naming_it(tiny_dirs):
    engine = make_engine(tiny_dirs / "llama", pipeline_parallel_size=2)
    try:
        for prompt in PROMPTS:
            engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=90, ignore_eos=True))
        for _ in range(3):
            engine.step()
        (worker,) = engine.executor.worker_pids
        os.kill(worker, signal.SIGKILL)
        with pytest.raises(ExecutorDeadError) as error:
            for _ in range(500):
                engine.step()
        message = str(error.value)
        assert "pipeline-parallel worker rank 1 (stage 1) died: killed by SIGKILL" in message
        assert "\n" not in message
        with pytest.raises(ExecutorDeadError, match="stage 1"):  # and the engine stays stopped
            engine.step()
    finally:
        engine.shutdown()


def test_llm_takes_pipeline_parallel_size(tiny_dirs):
    from hetero_core import LLM

    options = dict(tokenizer="byte", block_size=4, max_model_len=128, dtype="float32")
    prompts = [{"prompt_token_ids": p} for p in PROMPTS[:2]]
    outputs = {}
    for size in (1, 2):
        with LLM(str(tiny_dirs / "llama"), pipeline_parallel_size=size, **options) as llm:
            outputs[size] = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert outputs[2] == outputs[1]


def test_hetero_run_with_two_stages_prints_the_text_of_one(smollm2_dir):
    from tests.cli_helpers import clean_env, hetero

    args = ["--model", str(smollm2_dir), "--dtype", "float32", "--max-tokens", "12", "--temperature", "0"]
    texts = {}
    for size in ("1", "2"):
        result = hetero(
            "run", "--pipeline-parallel-size", size, *args, "The capital of France is", env=clean_env()
        )
        assert result.returncode == 0, result.stderr
        texts[size] = result.stdout
    assert texts["2"] == texts["1"] and texts["1"].strip()


def test_smollm2_in_two_stages_gives_the_greedy_tokens_of_one(smollm2_dir):
    shared = "You are a helpful assistant. Answer in one short sentence, and be precise about facts. "
    prompts = [shared + q for q in ("The capital of France is", "def fibonacci(n):", "你好，世界！")]
    params = SamplingParams(temperature=0, max_tokens=12)
    outputs, stats = {}, {}
    for size in (1, 2):
        settings = load_settings(
            model=str(smollm2_dir),
            executor="torch",
            dtype="float32",
            pipeline_parallel_size=size,
            max_prefill_chunk=4,  # chunked prefill
            max_num_blocks=6,  # 3 sequences of ~30-45 tokens in 16-token blocks: some are preempted
            memory_threshold=1.0,
        )
        engine = build_engine(settings, load_plugins(entry_points=[]))
        try:
            outputs[size] = [o.output_token_ids for o in engine.generate(prompts, params)]
            stats[size] = engine.stats()
        finally:
            engine.shutdown()
    assert outputs[2] == outputs[1]
    assert all(len(tokens) > 3 for tokens in outputs[1])
    assert stats[2].prefix_cache_hit_tokens > 0 and stats[2].num_preemptions > 0
