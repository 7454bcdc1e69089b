"""The two test tiers. Every test is in the full run (``pytest -q``); the fast tier (``pytest -q -m "not
slow"``) leaves out the tests marked ``slow``. A test is slow when it says so (``@pytest.mark.slow``) or,
assigned here at collection, when it uses a fixture or sits in a file or folder listed below: the real
SmolLM2 model, the Hugging Face reference models, worker processes, Triton's CPU interpreter, Ray, fresh
virtual environments. Everything else stays fast, including the mock executor, the kernels' contract,
the server on the mock and the contract kits.
"""

from __future__ import annotations

import os

# fixture -> why a test using it (directly or through another fixture) is slow
SLOW_FIXTURES = {
    "smollm2_dir": "loads the real SmolLM2 model",
}

# a file or a folder (ending in "/"), relative to the repository root -> why its tests are slow
SLOW_PATHS = {
    "tests/model/": "runs tiny Hugging Face models as the reference for the torch executor",
    "tests/moe/": "runs tiny Hugging Face mixture-of-experts models as the reference",
    "tests/cuda/": "runs the CUDA executor on its flash-attn test double against the torch executor",
    "tests/distributed/": "starts tensor-parallel worker processes",
    "tests/triton/": "runs the Triton kernels in Triton's CPU interpreter",
    "tests/replicas/": "starts Ray",
    "tests/speculative/": "runs draft models",
    "tests/test_install.py": "installs into fresh virtual environments",
    "tests/bench/test_bench.py": "runs every benchmark small, several in fresh processes",
    "tests/bench/test_random_models.py": "runs tiny Hugging Face models as the reference",
    "plugins/hetero-model-phi3/tests/": "runs the Phi-3 plugin against transformers' Phi-3",
}

# files inside a slow folder that stay fast (a fixture or a hand-written mark still makes a test slow)
FAST_PATHS = {
    "tests/model/test_kernel_contract.py",  # the kernels' contract: every kernel on 0, 1 and odd sizes
    "tests/model/test_gguf_fixtures.py",  # the tiny GGUF fixtures: read, dequantized, loaded; no model run
}


def slow_reason(nodeid: str, fixturenames) -> str | None:
    """Why the test ``nodeid`` (using ``fixturenames``) is in the slow tier, or None for the fast tier.
    With ``TEST_TIERS_BY_HAND=1`` (scripts/gpu_check.sh: its GPU files sit in slow folders) only a
    hand-written ``@pytest.mark.slow`` counts."""
    if os.environ.get("TEST_TIERS_BY_HAND") == "1":
        return None
    path = nodeid.split("::", 1)[0]
    for name in fixturenames:
        if name in SLOW_FIXTURES:
            return SLOW_FIXTURES[name]
    if path in FAST_PATHS:
        return None
    for prefix, reason in SLOW_PATHS.items():
        if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
            return reason
    return None
