"""The flash-attn executor's factory: checks what it needs, then says what is missing."""

from __future__ import annotations

from hetero_core.errors import PluginError


def missing_requirements() -> list[str]:
    """Reasons this machine cannot run the cuda executor (empty when it can)."""
    reasons = []
    try:
        import torch
    except ImportError:
        return ["torch is not installed (pip install 'hetero-core[torch]')"]
    if not torch.cuda.is_available():
        reasons.append("no CUDA device is visible to torch (torch.cuda.is_available() is False)")
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        reasons.append("flash-attn is not installed (pip install flash-attn --no-build-isolation, needs CUDA)")
    return reasons


def create_cuda_executor(ctx):
    reasons = missing_requirements()
    if reasons:
        raise PluginError("executor 'cuda' cannot run here: " + "; ".join(reasons))
    raise PluginError(
        "executor 'cuda' (flash-attn) is not implemented yet in hetero-plugins-cuda 0.1.0; "
        "use --executor torch"
    )
