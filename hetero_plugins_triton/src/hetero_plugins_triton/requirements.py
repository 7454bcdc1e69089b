"""What the Triton executor needs on this machine: checked without importing triton."""

from __future__ import annotations

import importlib.util
import os


def interpreter_requested(option: bool) -> bool:
    """Interpreter mode: the plugin option, or ``TRITON_INTERPRET=1`` in the environment."""
    return option or os.environ.get("TRITON_INTERPRET", "0") == "1"


def cannot_run(options) -> list[str]:
    """The preflight (before the model is resolved or converted): the packages the executor cannot
    start without, then, with them there, what its ``options`` ask of this machine that it lacks: a
    CUDA device, or an interpreter that works (one line each, with the fix)."""
    reasons = missing_packages()
    if not reasons:
        problem = device_problem(interpreter_requested(options.interpreter))
        reasons += [problem] if problem else []
    return reasons


def missing_packages() -> list[str]:
    """The packages the executor cannot start without (one line each, with the fix)."""
    reasons = []
    if importlib.util.find_spec("torch") is None:
        reasons.append("torch is not installed (pip install 'hetero-core[torch]')")
    if importlib.util.find_spec("triton") is None:
        reasons.append("triton is not installed (pip install triton, or pip install hetero-plugins-triton)")
    return reasons


def device_problem(interpret: bool) -> str | None:
    """Why the kernels cannot run here: in interpreter mode, an interpreter that fails
    (``interpreter_problem``); otherwise no CUDA device visible to torch."""
    if interpret:
        return interpreter_problem()
    import torch

    if not torch.cuda.is_available():
        return (
            "no CUDA device is visible to torch; set executor.triton.interpreter = true (or "
            "TRITON_INTERPRET=1) to run its kernels on the CPU through Triton's interpreter (slow), or use "
            "--executor torch"
        )
    return None


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
