"""Fixtures for the model tests: tiny random HF models saved locally, and a TorchExecutor factory."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

# Helper modules of this folder (tiny_models, paged_batches) import by name under any import mode.

from hetero_core.default_plugins.torch_executor import TorchExecutor  # noqa: E402
from hetero_core.executor import ExecutorContext  # noqa: E402
from tests.model.tiny_models import BLOCK_CODE_MODELS, TINY_MODELS, save_tiny_model  # noqa: E402


@pytest.fixture
def make_executor():
    def make(model_dir, *, num_blocks: int = 64, block_size: int = 16, options=None) -> TorchExecutor:
        ctx = ExecutorContext(
            settings=None,
            options=options,
            model_dir=Path(model_dir),
            num_blocks=num_blocks,
            block_size=block_size,
            max_model_len=4096,
            max_num_batched_tokens=4096,
            max_num_seqs=16,
            eos_token_id=None,
            vocab_size=0,
        )
        return TorchExecutor(ctx)

    return make


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory):
    """Every tiny model saved once per session: name -> (directory, HF model)."""
    root = tmp_path_factory.mktemp("tiny_models")
    return {
        name: (root / name, save_tiny_model(name, root / name)) for name in [*TINY_MODELS, *BLOCK_CODE_MODELS]
    }


@pytest.fixture
def cpu_kernels():
    """The compiled CPU attention kernels; the test skips, saying why, where they cannot be built."""
    from hetero_core.model.cpu.kernels import KernelUnavailable, load_cpu_kernels

    try:
        return load_cpu_kernels(required=True)
    except KernelUnavailable as exc:
        pytest.skip(f"the CPU kernels cannot be built here: {exc}")


@pytest.fixture
def prepared_cache_dir(tmp_path, monkeypatch):
    """An empty cache, and a size floor of 0 so the tiny models get prepared files; the prepared folder."""
    from hetero_core.model.cpu import prepared_weights

    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(prepared_weights, "MIN_CHECKPOINT_BYTES", 0)
    return tmp_path / "cache" / "prepared"
