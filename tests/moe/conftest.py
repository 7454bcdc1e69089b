"""Fixtures for the mixture-of-experts tests: tiny random HF MoE models saved once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

HERE = Path(__file__).parent

from tests.moe.tiny_moe_models import TINY_MOE_MODELS, save_tiny_moe_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_moe_dirs(tmp_path_factory):
    """Every tiny MoE model saved once: name -> (directory, HF model)."""
    root = tmp_path_factory.mktemp("tiny_moe_models")
    return {name: (root / name, save_tiny_moe_model(name, root / name)) for name in TINY_MOE_MODELS}
