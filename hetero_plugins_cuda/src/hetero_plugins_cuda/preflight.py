"""What this machine lacks to run the cuda executor (checked before any model is loaded)."""

from __future__ import annotations

FLASH_ATTN_INSTALL = (
    "pip install 'hetero-plugins-cuda[flash-attn]' --no-build-isolation "
    "(builds flash-attn 2.x against the installed torch; needs the CUDA toolkit), or on a Hopper or "
    "Blackwell GPU pip install 'flash-attn-4[cu13]' (prebuilt; [cu13] for a CUDA 13 driver)"
)


def missing_requirements() -> list[str]:
    """Reasons this machine cannot run the cuda executor (empty when it can)."""
    try:
        import torch
    except ImportError:
        return ["torch is not installed (pip install 'hetero-core[torch]')"]
    reasons = []
    if not torch.cuda.is_available():
        reasons.append(
            f"no CUDA device is visible to torch {torch.__version__} (torch.cuda.is_available() is False; "
            "install a CUDA build of torch on a machine with an NVIDIA GPU)"
        )
    if not has_flash_attn():
        reasons.append(f"flash-attn is not installed ({FLASH_ATTN_INSTALL})")
    return reasons


def has_flash_attn() -> bool:
    """flash-attn 2.x (``flash_attn`` with its functions) or flash-attn-4 (``flash_attn.cute``) is
    there; imports neither's kernels."""
    import importlib.util

    try:
        import flash_attn
    except ImportError:
        return False
    if hasattr(flash_attn, "flash_attn_varlen_func"):
        return True
    return importlib.util.find_spec("flash_attn.cute") is not None
