"""What the Triton executor needs on this machine: checked without importing triton."""

from __future__ import annotations

import importlib.util
import os


def interpreter_requested(option: bool) -> bool:
    """Interpreter mode: the plugin option, or ``TRITON_INTERPRET=1`` in the environment."""
    return option or os.environ.get("TRITON_INTERPRET", "0") == "1"


def missing_packages() -> list[str]:
    """The preflight: packages the executor cannot start without (one line each, with the fix).

    Whether a CUDA GPU is needed depends on the ``interpreter`` option, which the preflight does not
    see; the factory checks it before loading any weight."""
    reasons = []
    if importlib.util.find_spec("torch") is None:
        reasons.append("torch is not installed (pip install 'hetero-core[torch]')")
    if importlib.util.find_spec("triton") is None:
        reasons.append("triton is not installed (pip install triton, or pip install hetero-plugins-triton)")
    return reasons


def interpreter_problem() -> str | None:
    """Triton before 3.7 cannot interpret loops with numpy 2.4 or later (triton-lang/triton#9171)."""
    from importlib.metadata import version

    def major_minor(name: str) -> tuple[int, int]:
        parts = version(name).split(".")
        return int(parts[0]), int(parts[1])

    if major_minor("triton") < (3, 7) and major_minor("numpy") >= (2, 4):
        return (
            f"triton {version('triton')}'s CPU interpreter fails with numpy {version('numpy')}; "
            "pip install 'triton>=3.7' (or 'numpy<2.4')"
        )
    return None
