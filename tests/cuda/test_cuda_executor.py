"""The cuda executor's wiring on the flash-attn test double (CPU, fp32): every step path gives the
torch executor's logits, graph padding touches only the scratch block, capabilities are checked
before any weight loads."""

from __future__ import annotations

import pydantic
import pytest
import torch

from hetero_core.errors import ConfigError
from hetero_core.model.decode_graphs import default_batch_sizes
from hetero_plugins_cuda.options import CudaExecutorOptions
from tests.cuda.flash_attn_double import FlashAttnDouble
from tests.cuda.step_plans import TOKENS, run_plan
from tests.model.paged_batches import BlockPool, PagedSequence, step


@pytest.mark.parametrize("name", ["llama", "qwen3"])
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_every_step_path_matches_the_torch_executor(
    name, cuda_graphs, tiny_dirs, make_cuda_executor, make_torch_executor
):
    model_dir, _ = tiny_dirs[name]
    executor = make_cuda_executor(model_dir, cuda_graphs=cuda_graphs)
    got, expected = run_plan(executor), run_plan(make_torch_executor(model_dir))
    assert [g.shape for g in got] == [e.shape for e in expected] == [(1, 96), (3, 96)] + [(3, 96)] * 5
    for g, e in zip(got, expected):
        assert g.dtype == torch.float32 and g.device.type == "cpu"
        assert (g - e).abs().max() < 1e-4
    calls = executor.double.calls
    assert calls["varlen"] == 2 * 1  # step 1: fresh prompts only, once per layer
    assert calls["varlen_paged"] == 2 * 1  # step 2: a continued prefill beside a decode
    assert calls["with_kvcache"] == 2 * 5  # pure decodes (padded static buffers when graphs are on)
    assert (executor.graph_runner is not None) == cuda_graphs


def test_graph_padding_rows_write_only_the_scratch_block(tiny_dirs, make_cuda_executor):
    model_dir, _ = tiny_dirs["llama"]
    executor = make_cuda_executor(model_dir, num_blocks=16, cuda_graph_batch_sizes=[1, 2, 4])
    runner = executor.graph_runner
    assert runner.scratch_block == 16 and executor.kv_caches[0].key.shape[0] == 17
    assert [runner.padded_size(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, 4, None]
    pool = BlockPool(16, shuffle=True)
    seqs = [PagedSequence(i, TOKENS[i : i + 20], 19) for i in range(3)]
    executor.execute(step([(s, 19) for s in seqs], pool, 16))
    used = sorted({b for s in seqs for b in s.block_table})
    scratch = executor.kv_caches[0].key[16]
    assert not scratch.any()  # prefills never use it
    batch = step([(s, 1) for s in seqs], pool, 16)
    assert runner.can_run(batch)
    executor.execute(batch)  # 3 sequences padded to 4: one padding row
    for key, value in executor.kv_caches:
        assert key[16, 0].any() and not key[16, 1:].any() and value[16, 0].any()
        untouched = [b for b in range(16) if b not in used]
        assert not key[untouched].any() and not value[untouched].any()


def test_steps_outside_the_captured_sizes_run_eagerly(tiny_dirs, make_cuda_executor, make_torch_executor):
    model_dir, _ = tiny_dirs["qwen3"]
    executor = make_cuda_executor(model_dir, cuda_graph_batch_sizes=[1, 2])
    got, expected = run_plan(executor), run_plan(make_torch_executor(model_dir))
    for g, e in zip(got, expected):
        assert (g - e).abs().max() < 1e-4
    assert executor.double.calls["with_kvcache"] == 2 * 5  # 3-sequence decodes: eager, same kernel


def test_default_batch_sizes():
    assert default_batch_sizes(1) == [1]
    assert default_batch_sizes(8) == [1, 2, 4, 8]
    assert default_batch_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    assert default_batch_sizes(256)[-3:] == [224, 240, 256]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            dict(double=FlashAttnDouble(), dtype="bfloat16", block_size=16),
            "block_size 16 is not a multiple of 256, which flash-attn test double "
            "\\(PyTorch\\)'s paged KV cache requires; set block_size = 256",
        ),
        (
            dict(double=FlashAttnDouble(page_block_multiple=16), dtype="float32"),
            "executor.cuda.dtype float32 is not supported by .* \\(supported: float16, bfloat16\\)",
        ),
        (dict(cuda_graph_batch_sizes=[4, 16]), "cuda_graph_batch_sizes \\[16\\] exceed max_batch_size 8"),
        (
            dict(cuda_graph_batch_sizes=[4], cuda_graphs=False),
            "cuda_graph_batch_sizes is set but cuda_graphs",
        ),
        (dict(gpu_memory_utilization=0.5), "gpu_memory_utilization needs a CUDA device"),
    ],
)
def test_unsupported_settings_fail_before_loading_weights(
    kwargs, message, tiny_dirs, make_cuda_executor, monkeypatch
):
    import hetero_plugins_cuda.executor as module

    model_dir, _ = tiny_dirs["llama"]
    monkeypatch.setattr(module, "load_model", lambda *a, **k: pytest.fail("weights loaded before the check"))
    with pytest.raises(ConfigError, match="executor 'cuda' cannot run these settings: .*" + message):
        make_cuda_executor(model_dir, **kwargs)


def test_kernels_limited_to_cuda_refuse_a_cpu_device(tiny_dirs):
    from hetero_plugins_cuda.executor import CudaExecutor
    from tests.cuda.cuda_contexts import executor_context

    model_dir, _ = tiny_dirs["llama"]
    kernels = FlashAttnDouble(page_block_multiple=16).kernels(device_types=("cuda",))
    options = CudaExecutorOptions(device="cpu", dtype="bfloat16")
    with pytest.raises(ConfigError, match="executor.cuda.device 'cpu': .* runs on cuda devices only"):
        CudaExecutor(executor_context(model_dir), options, kernels=kernels)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_device_without_cuda_is_a_config_error(tiny_dirs, make_cuda_executor):
    model_dir, _ = tiny_dirs["llama"]
    with pytest.raises(ConfigError, match="executor.cuda.device is 'cuda' but this torch build sees no CUDA"):
        make_cuda_executor(model_dir, device="cuda")


def test_options_are_validated():
    with pytest.raises(pydantic.ValidationError):
        CudaExecutorOptions(cuda_graph=False)  # typo
    with pytest.raises(pydantic.ValidationError):
        CudaExecutorOptions(gpu_memory_utilization=1.5)
    with pytest.raises(pydantic.ValidationError, match="each >= 1"):
        CudaExecutorOptions(cuda_graph_batch_sizes=[0, 4])
    assert CudaExecutorOptions(cuda_graph_batch_sizes=[8, 1, 8]).cuda_graph_batch_sizes == [1, 8]
