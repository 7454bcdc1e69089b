"""Triton tests: on a CUDA machine the kernels run compiled on the GPU (fp16, bf16, fp32); elsewhere
they run through Triton's CPU interpreter in fp32, on tiny shapes.

Triton fixes its mode when first imported, so this conftest imports it for the interpreter during
collection, before any test can import it for the GPU (torch imports triton lazily, e.g. when
transformers builds a model). ``TRITON_INTERPRET`` is set only for that import and for each
interpreted launch: nothing leaks into other tests or their subprocesses.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import pytest

pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:  # not importorskip: that would import it for the GPU
    pytest.skip(
        "triton is not installed (pip install triton); the Triton executor needs it", allow_module_level=True
    )

import torch  # noqa: E402

from hetero_core.errors import ConfigError  # noqa: E402
from hetero_plugins_triton.kernels.compile import import_triton  # noqa: E402

ON_GPU = torch.cuda.is_available()
try:
    import_triton(interpret=not ON_GPU)
    TRITON_MODE_PROBLEM = None
except ConfigError as exc:
    TRITON_MODE_PROBLEM = str(exc)

# tests/model's helpers (tiny random HF models, hand-built paged batches).


@dataclass(frozen=True)
class KernelMode:
    interpret: bool
    device: torch.device


def pytest_collection_modifyitems(config, items):
    if TRITON_MODE_PROBLEM is None:
        return
    skip = pytest.mark.skip(
        reason=f"triton was imported in the wrong mode before these tests: {TRITON_MODE_PROBLEM}"
    )
    for item in items:
        if "tests/triton" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def mode() -> KernelMode:
    return KernelMode(interpret=not ON_GPU, device=torch.device("cuda" if ON_GPU else "cpu"))


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


# The CPU interpreter runs float32 only (numpy has no bfloat16); fp16/bf16 are tested on a GPU.
@pytest.fixture(params=list(DTYPES) if ON_GPU else ["float32"])
def dtype(request) -> torch.dtype:
    return DTYPES[request.param]
