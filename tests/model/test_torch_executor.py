"""TorchExecutor: the Executor protocol, its options (each one does something), and its KV cache."""

from __future__ import annotations

import pydantic
import pytest
import torch

from hetero_core.default_plugins.torch_executor import TorchExecutor, TorchExecutorOptions
from hetero_core.engine.scheduling.batch import ExecutorOutput
from hetero_core.errors import ConfigError, ModelLoadError
from hetero_core.executor import Executor, ExecutorContext
from hetero_core.model.cpu.linear import PackedLinear, can_pack
from tests.model.paged_batches import BlockPool, PagedSequence, step
from tests.model.tiny_models import VOCAB, hf_logits

PROMPT = list(range(2, 42))


def run_prompt(executor, tokens=PROMPT, block_size=16):
    seq = PagedSequence(0, list(tokens), len(tokens))
    return executor.execute(step([(seq, len(tokens))], BlockPool(64), block_size))


def test_implements_the_executor_protocol_and_allocates_the_cache(tiny_model_dirs, make_executor):
    model_dir, _ = tiny_model_dirs["llama"]
    executor = make_executor(model_dir, num_blocks=10, block_size=8)
    assert isinstance(executor, Executor)
    assert len(executor.kv_caches) == 2
    for key, value in executor.kv_caches:
        assert key.shape == value.shape == (2, 10, 8, 16) and key.dtype == torch.float32
    output = run_prompt(executor, block_size=8)
    assert isinstance(output, ExecutorOutput) and output.token_ids is None
    executor.shutdown()


def test_options_reject_unknown_fields():
    with pytest.raises(pydantic.ValidationError):
        TorchExecutorOptions(devcie="cpu")
    with pytest.raises(pydantic.ValidationError):
        TorchExecutorOptions(dtype="float64")
    with pytest.raises(pydantic.ValidationError):
        TorchExecutorOptions(num_threads=0)


def test_bfloat16_runs_in_bfloat16_and_returns_float32_logits(tiny_model_dirs, make_executor):
    model_dir, hf_model = tiny_model_dirs["llama"]
    executor = make_executor(model_dir, options=TorchExecutorOptions(dtype="bfloat16"))
    assert executor.kv_caches[0].key.dtype == torch.bfloat16
    assert executor.model.model.embed_tokens.weight.dtype == torch.bfloat16
    logits = run_prompt(executor).logits
    assert logits.dtype == torch.float32 and logits.device.type == "cpu"
    expected = hf_logits(hf_model, PROMPT)[-1]
    assert (logits[0] - expected).abs().max() < 0.5  # bf16 is close, not exact
    assert logits[0].argmax() == expected.argmax()


def test_num_threads_sets_torch_threads(tiny_model_dirs, make_executor):
    model_dir, _ = tiny_model_dirs["llama"]
    before = torch.get_num_threads()
    try:
        make_executor(model_dir, options=TorchExecutorOptions(num_threads=1))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("prepack", [True, False])
def test_prepack_weights_switches_linears_to_onednn(prepack, tiny_model_dirs, make_executor):
    if not can_pack(torch.device("cpu"), torch.float32):
        pytest.skip("this torch build has no oneDNN")
    model_dir, hf_model = tiny_model_dirs["llama_mqa_tied"]
    executor = make_executor(model_dir, options=TorchExecutorOptions(prepack_weights=prepack))
    model = executor.model
    linears = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, PackedLinear))]
    assert len(linears) == 4 * 2 + prepack  # per layer: qkv, o, gate_up, down; the tied lm_head once packed
    assert all(isinstance(m, PackedLinear) == prepack for m in linears)
    assert (model.lm_head is None) != prepack
    logits = run_prompt(executor).logits
    assert (logits[0] - hf_logits(hf_model, PROMPT)[-1]).abs().max() < 1e-4


@pytest.mark.parametrize("device", ["cuda:0", "not-a-device"])
def test_unusable_device_is_a_config_error(device, tiny_model_dirs, make_executor):
    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    model_dir, _ = tiny_model_dirs["llama"]
    with pytest.raises(ConfigError, match="executor.torch.device"):
        make_executor(model_dir, options=TorchExecutorOptions(device=device))


def test_needs_a_model_dir():
    ctx = ExecutorContext(
        None,
        None,
        None,
        num_blocks=4,
        block_size=16,
        max_model_len=64,
        max_num_batched_tokens=64,
        max_num_seqs=1,
        eos_token_id=None,
        vocab_size=0,
    )
    with pytest.raises(ModelLoadError, match="needs a model"):
        TorchExecutor(ctx)


def test_rows_follow_sample_indices(tiny_model_dirs, make_executor):
    model_dir, hf_model = tiny_model_dirs["qwen2"]
    executor = make_executor(model_dir)
    first = PagedSequence(1, PROMPT[:20], 20)
    middle = PagedSequence(2, PROMPT[5:35], 30)  # only its first chunk runs: not sampled
    last = PagedSequence(3, PROMPT[10:17], 7)
    batch = step([(first, 20), (middle, 10), (last, 7)], BlockPool(64, shuffle=True), 16)
    assert batch.sample_indices == [0, 2]
    logits = executor.execute(batch).logits
    assert logits.shape == (2, VOCAB)
    assert (logits[0] - hf_logits(hf_model, first.token_ids)[-1]).abs().max() < 1e-4
    assert (logits[1] - hf_logits(hf_model, last.token_ids)[-1]).abs().max() < 1e-4


def test_block_table_too_short_is_reported(tiny_model_dirs, make_executor):
    model_dir, _ = tiny_model_dirs["llama"]
    executor = make_executor(model_dir)
    batch = step([(PagedSequence(4, PROMPT, 40), 40)], BlockPool(64), 16)
    broken = type(batch)(**{**batch.__dict__, "block_tables": [batch.block_tables[0][:2]]})
    with pytest.raises(ValueError, match="sequence 4: block table holds 32 slots but context_len is 40"):
        executor.execute(broken)
