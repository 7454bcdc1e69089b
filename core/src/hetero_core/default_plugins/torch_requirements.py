"""What the real-model path (torch executor, hf tokenizer, model loading) needs installed.

Checked without importing anything heavy, before a model is resolved or loaded, so a machine with
only ``hetero-core`` and the mock plugin gets one line saying what to install, not a traceback.
"""

from __future__ import annotations

import importlib.util

from hetero_core.errors import MissingDependencyError

# The CPU-only build, as https://pytorch.org/get-started/locally/ gives it (the default index
# serves a multi-GB CUDA build on Linux).
TORCH_CPU_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
EXTRA_INSTALL = "pip install 'hetero-core[torch]'"
# Import name -> distribution, for every package of the ``torch`` extra the run path imports.
REAL_MODEL_MODULES = {
    "torch": "torch",
    "numpy": "numpy",
    "safetensors": "safetensors",
    "tokenizers": "tokenizers",
    "jinja2": "Jinja2",
    "gguf": "gguf",
}


def missing_real_model_packages() -> list[str]:
    """Reasons the real-model path cannot run here (empty when everything is installed)."""
    missing = [
        dist for module, dist in REAL_MODEL_MODULES.items() if importlib.util.find_spec(module) is None
    ]
    if not missing:
        return []
    if "torch" in missing:
        return [
            f"torch is not installed; for the CPU build run: {TORCH_CPU_INSTALL} && {EXTRA_INSTALL} "
            "(or choose another executor, e.g. --executor mock)"
        ]
    return [
        f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed; run: {EXTRA_INSTALL}"
    ]


def require_real_model_packages(what: str) -> None:
    """Raise ``MissingDependencyError`` naming ``what`` when a package of the real-model path is missing."""
    reasons = missing_real_model_packages()
    if reasons:
        raise MissingDependencyError(f"{what}: {reasons[0]}")
