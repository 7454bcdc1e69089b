"""Shared fixtures. Each test builds its own world; only expensive, read-only assets are shared."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_dir():
    """The embedded SmolLM2-135M-Instruct converted to an HF directory (cached across runs)."""
    pytest.importorskip("torch")
    from hetero_core.model.embedded import ensure_embedded_model

    return ensure_embedded_model()
