"""Which flash-attn this machine has: 2.x (``flash_attn``) first, else flash-attn-4 (``flash_attn.cute``)."""

from __future__ import annotations

import torch

from hetero_core import PluginError
from hetero_plugins_cuda.flash_attn4 import flash_attn4_kernels
from hetero_plugins_cuda.kernels import FlashAttnKernels
from hetero_plugins_cuda.preflight import FLASH_ATTN_INSTALL


def load_flash_attn() -> FlashAttnKernels:
    """flash-attn 2.x's kernels, else flash-attn-4's, or a PluginError saying what to install."""
    try:
        return _flash_attn2()
    except ImportError as exc:
        fa2_error = exc
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except ImportError as exc:
        raise PluginError(
            f"executor 'cuda' needs flash-attn 2.x or flash-attn-4: {fa2_error}; {exc}; {FLASH_ATTN_INSTALL}"
        ) from exc
    return flash_attn4_kernels(flash_attn_varlen_func, _distribution_version("flash-attn-4"))


def _distribution_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


def _flash_attn2() -> FlashAttnKernels:
    """flash-attn 2.x's kernels; ImportError where its module is missing (flash-attn-4 alone
    installs ``flash_attn`` as a namespace package without these functions)."""
    import flash_attn
    from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

    version = getattr(flash_attn, "__version__", "unknown")
    if not version.startswith("2."):
        raise PluginError(
            f"executor 'cuda' supports flash-attn 2.x; found flash-attn {version} "
            "(pip install 'flash-attn>=2.6,<3' --no-build-isolation)"
        )
    return FlashAttnKernels(
        name=f"flash-attn {version}",
        varlen=flash_attn_varlen_func,
        with_kvcache=flash_attn_with_kvcache,
        page_block_multiple=256,
        dtypes=(torch.float16, torch.bfloat16),
        device_types=("cuda",),
    )
