"""Decode graphs (``model/decode_graphs.py``) over the torch backend, emulated on the CPU: the padded,
static-input steps a CUDA graph replays give the eager runner's logits, in one upload per step, and
padding rows touch only the scratch block. (On a GPU, tests/cuda/test_cuda_gpu.py captures for real.)"""

from __future__ import annotations

import pytest
import torch

from hetero_core.default_plugins.torch_executor import TorchExecutorOptions
from hetero_core.model.decode_graphs import DecodeGraphs, build_decode_graphs, default_batch_sizes
from hetero_core.model.step_inputs import StepInputs
from tests.model.paged_batches import BlockPool, PagedSequence, step
from tests.model.transfer_doubles import RecordingTransfers

TORCH_PATH = TorchExecutorOptions(device="cpu", dtype="float32", cpu_kernels="torch")  # the GPU's code path
NUM_BLOCKS = 64  # the pool's; the cache holds one more, the scratch block


def plan():
    seqs = [PagedSequence(i, list(range(3 + 7 * i, 3 + 7 * i + 30)), 20 + i) for i in range(3)]
    """Three prompts of 20-22 tokens, then four decode steps of all three."""
    return [[(s, s.num_prompt_tokens) for s in seqs]] + [[(s, 1) for s in seqs]] * 4


def graphs_for(executor, sizes):
    return build_decode_graphs(
        executor.runner,
        scratch_block=NUM_BLOCKS,
        max_num_seqs=max(sizes),
        max_model_len=256,
        batch_sizes=sizes,
    )


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_padded_decode_steps_give_the_eager_logits(name, tiny_model_dirs, make_executor):
    model_dir, _ = tiny_model_dirs[name]
    eager = make_executor(model_dir, options=TORCH_PATH)
    graphed = make_executor(model_dir, options=TORCH_PATH, num_blocks=NUM_BLOCKS + 1)
    graphed.graph_runner = graphs_for(graphed, [1, 2, 4])
    transfers = RecordingTransfers()
    graphed.graph_runner.inputs = StepInputs("cpu", transfers=transfers)  # the CUDA path's upload, counted
    pool_a, pool_b = BlockPool(NUM_BLOCKS, shuffle=True, seed=2), BlockPool(NUM_BLOCKS, shuffle=True, seed=2)
    scratch_before = [layer.key[:, NUM_BLOCKS].clone() for layer in graphed.kv_caches]
    for number, (segments_a, segments_b) in enumerate(zip(plan(), plan())):
        batch = step(segments_b, pool_b, 16)
        expected = eager.execute(step(segments_a, pool_a, 16)).logits
        assert graphed.graph_runner.can_run(batch) == (number > 0)  # decodes only; 3 padded to 4
        got = graphed.execute(batch).logits
        assert got.shape == expected.shape and got.dtype == torch.float32
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)  # padded shapes: close, not equal
        assert torch.equal(got.argmax(-1), expected.argmax(-1))
        assert transfers.num_copies == number  # one upload per graph step
    for layer, before in zip(graphed.kv_caches, scratch_before):
        assert not torch.equal(layer.key[:, NUM_BLOCKS], before)  # padding rows wrote the scratch block


def test_a_step_returns_its_own_memory_not_the_graphs_reused_output(tiny_model_dirs, make_executor):
    model_dir, _ = tiny_model_dirs["llama"]
    executor = make_executor(model_dir, options=TORCH_PATH, num_blocks=NUM_BLOCKS + 1)
    executor.graph_runner = graphs_for(executor, [4])
    steps = plan()
    pool = BlockPool(NUM_BLOCKS)
    executor.execute(step(steps[0], pool, 16))
    first = executor.execute(step(steps[1], pool, 16)).logits
    kept = first.clone()
    executor.execute(step(steps[2], pool, 16))
    assert torch.equal(first, kept)


def test_steps_it_cannot_replay_run_eagerly(tiny_model_dirs, make_executor):
    model_dir, _ = tiny_model_dirs["llama"]
    executor = make_executor(model_dir, options=TORCH_PATH, num_blocks=NUM_BLOCKS + 1)
    graphs = DecodeGraphs(
        executor.model,
        executor.kv_caches,
        batch_sizes=[2],
        max_blocks_per_seq=2,
        scratch_block=NUM_BLOCKS,
        block_size=16,
        device=torch.device("cpu"),
    )
    seqs = [PagedSequence(i, list(range(3, 60)), 40) for i in range(3)]
    pool = BlockPool(NUM_BLOCKS)
    prefill = step([(s, 40) for s in seqs], pool, 16)
    assert not graphs.can_run(prefill)  # not a pure decode
    decode = step([(s, 1) for s in seqs], pool, 16)
    assert not graphs.can_run(decode)  # 3 sequences > the largest size, 3 blocks > the table's 2


def test_default_batch_sizes():
    assert default_batch_sizes(1) == [1]
    assert default_batch_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    assert default_batch_sizes(256)[-2:] == [240, 256]
