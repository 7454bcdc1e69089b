"""Fixtures for the cuda executor tests: tiny random HF models, executors on the flash-attn test
double (CPU here, CUDA on a GPU machine), and the torch executor as the reference."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

# Helper modules: this folder's (flash_attn_double) and the model tests' (tiny_models, paged_batches).

from hetero_core.default_plugins.torch_executor import TorchExecutor, TorchExecutorOptions  # noqa: E402
from hetero_plugins_cuda.executor import CudaExecutor  # noqa: E402
from hetero_plugins_cuda.options import CudaExecutorOptions  # noqa: E402
from tests.cuda.cuda_contexts import executor_context  # noqa: E402
from tests.cuda.flash_attn_double import FlashAttnDouble  # noqa: E402
from tests.model.tiny_models import save_tiny_model  # noqa: E402

TINY_NAMES = ("llama", "qwen3")


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """name -> (directory, HF model), saved once per session."""
    root = tmp_path_factory.mktemp("cuda_tiny_models")
    return {name: (root / name, save_tiny_model(name, root / name)) for name in TINY_NAMES}


@pytest.fixture
def make_cuda_executor():
    """A CudaExecutor on the test double; CPU fp32 with 16-token pages unless told otherwise."""

    def make(
        model_dir,
        *,
        double=None,
        device="cpu",
        dtype="float32",
        block_size=16,
        num_blocks=64,
        max_num_seqs=8,
        **options,
    ):
        double = double or FlashAttnDouble(page_block_multiple=16, dtypes=_dtypes())
        opts = CudaExecutorOptions(device=device, dtype=dtype, **options)
        ctx = executor_context(
            model_dir, num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs
        )
        executor = CudaExecutor(ctx, opts, kernels=double.kernels())
        executor.double = double
        return executor

    return make


@pytest.fixture
def make_torch_executor():
    def make(model_dir, *, device="cpu", dtype="float32", block_size=16, num_blocks=64):
        ctx = executor_context(model_dir, num_blocks=num_blocks, block_size=block_size)
        return TorchExecutor(ctx, options=TorchExecutorOptions(device=device, dtype=dtype))

    return make


def _dtypes():
    import torch

    return (torch.float32, torch.float16, torch.bfloat16)
