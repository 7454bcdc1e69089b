"""A mixture-of-experts model on the cuda executor: every step path gives the torch executor's logits
(on the flash-attn test double here, on CUDA on a GPU machine), decode steps eager under cuda_graphs
(a MoE layer reads its experts' token counts on the host)."""

from __future__ import annotations

import pytest
import torch

from hetero_core.default_plugins.torch_executor import TorchExecutor, TorchExecutorOptions
from hetero_plugins_cuda.executor import CudaExecutor
from hetero_plugins_cuda.options import CudaExecutorOptions
from tests.cuda.cuda_contexts import executor_context
from tests.cuda.flash_attn_double import FlashAttnDouble
from tests.cuda.step_plans import run_plan
from tests.moe.tiny_moe_models import save_tiny_moe_model  # noqa: E402


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cuda_moe") / "qwen2_moe"
    save_tiny_moe_model("qwen2_moe", directory)
    return directory


DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(
            not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none"
        ),
    ),
]


@pytest.mark.parametrize("device", DEVICES)
def test_every_step_path_matches_the_torch_executor(moe_dir, device):
    double = FlashAttnDouble(page_block_multiple=16, dtypes=(torch.float32, torch.float16, torch.bfloat16))
    ctx = executor_context(moe_dir, num_blocks=64, block_size=16)
    executor = CudaExecutor(
        ctx,
        CudaExecutorOptions(device=device, dtype="float32", cuda_graphs=True),
        kernels=double.kernels(("cpu", "cuda")),
    )
    reference = TorchExecutor(ctx, options=TorchExecutorOptions(device=device, dtype="float32"))
    assert executor.graph_runner is None  # eager decode steps
    for got, expected in zip(run_plan(executor), run_plan(reference), strict=True):
        assert (got - expected).abs().max() < 1e-4
