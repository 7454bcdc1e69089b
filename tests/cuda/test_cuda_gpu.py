"""The cuda executor on a real GPU: captured CUDA graphs, bf16, KV sizing from GPU memory; with
flash-attn (2.x or 4) when it is installed, and with the test double (whose decode is captured for real)."""

from __future__ import annotations

import pytest
import torch

from hetero_core.errors import ConfigError
from hetero_plugins_cuda.executor import CudaExecutor
from hetero_plugins_cuda.options import CudaExecutorOptions
from tests.cuda.cuda_contexts import executor_context
from tests.cuda.flash_attn_double import FlashAttnDouble
from tests.cuda.step_plans import run_plan

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none"),
]


def kernels(provider: str, dtypes=(torch.float16, torch.bfloat16)):
    """(kernels, block_size): flash-attn itself (2.x: pages of 256; flash-attn-4: 128, its TMA path), the
    same with pages of 16 (flash-attn-4's cp.async path; flash-attn 2.x refuses them), or the double."""
    if provider.startswith("flash_attn"):
        from hetero_plugins_cuda.loader import load_flash_attn
        from hetero_plugins_cuda.preflight import has_flash_attn

        if not has_flash_attn():
            pytest.skip("flash-attn is not installed on this GPU machine")
        found = load_flash_attn()
        if provider == "flash_attn_16":
            if 16 % found.page_block_multiple:
                pytest.skip(f"{found.name} takes no 16-token pages")
            return found, 16
        return found, found.fast_block_size or found.page_block_multiple
    return FlashAttnDouble(page_block_multiple=16, dtypes=dtypes).kernels(("cuda",)), 16


def cuda_executor(
    model_dir, provider, *, dtype="bfloat16", cuda_graphs=True, dtypes=(torch.float16, torch.bfloat16)
):
    found, block_size = kernels(provider, dtypes)
    ctx = executor_context(model_dir, block_size=block_size, num_blocks=64 if block_size == 16 else 8)
    options = CudaExecutorOptions(device="cuda", dtype=dtype, cuda_graphs=cuda_graphs)
    return CudaExecutor(ctx, options, kernels=found), block_size


@pytest.mark.parametrize("provider", ["flash_attn", "flash_attn_16", "double"])
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_bf16_logits_then_tokens_match_the_torch_executor(
    provider, cuda_graphs, tiny_dirs, make_torch_executor
):
    model_dir, _ = tiny_dirs["qwen3"]
    executor, block_size = cuda_executor(model_dir, provider, cuda_graphs=cuda_graphs)
    assert (executor.graph_runner is not None and executor.graph_runner.graphs != {}) == cuda_graphs
    num_blocks = executor.num_kv_blocks
    got = run_plan(executor, block_size, num_blocks)
    expected = run_plan(
        make_torch_executor(
            model_dir, device="cuda", dtype="bfloat16", block_size=block_size, num_blocks=num_blocks
        ),
        block_size,
        num_blocks,
    )
    for g, e in zip(got, expected):
        assert (g - e).abs().max() < 0.1 * e.abs().max()  # bf16: close, not equal
        top2 = e.topk(2).values
        clear = (top2[:, 0] - top2[:, 1]) > 0.1 * e.abs().max()
        assert (g.argmax(-1) == e.argmax(-1))[clear].all()


def test_fp32_graph_replay_matches_the_torch_executor_on_cuda(tiny_dirs, make_torch_executor):
    model_dir, _ = tiny_dirs["llama"]
    all_dtypes = (torch.float32, torch.float16, torch.bfloat16)
    executor, _ = cuda_executor(model_dir, "double", dtype="float32", dtypes=all_dtypes)
    got = run_plan(executor)
    expected = run_plan(make_torch_executor(model_dir, device="cuda"))
    for g, e in zip(got, expected):
        assert (g - e).abs().max() < 1e-3


def test_kv_pool_sized_from_a_gpu_memory_share(tiny_dirs):
    model_dir, _ = tiny_dirs["llama"]
    double = FlashAttnDouble(page_block_multiple=16).kernels(("cuda",))
    total = torch.cuda.mem_get_info()[1]

    def build(share, max_blocks):
        options = CudaExecutorOptions(device="cuda", gpu_memory_utilization=share, cuda_graphs=False)
        return CudaExecutor(executor_context(model_dir, num_blocks=max_blocks), options, kernels=double)

    capped = build(0.9, 64)
    assert capped.num_kv_blocks == 64  # max_num_blocks caps the pool
    capped.shutdown()
    sized = build(0.05, 10**9)
    per_block = 2 * 2 * 16 * 2 * 16 * 2  # K+V, 2 layers, 16 slots, 2 KV heads, head_dim 16, bf16
    assert 0 < sized.num_kv_blocks < 10**9 and sized.num_kv_blocks * per_block <= 0.05 * total
    sized.shutdown()
    with pytest.raises(ConfigError, match="gpu_memory_utilization = 1e-06 leaves no room for KV blocks"):
        build(1e-6, 64)
