"""Deprecated name of ``hetero_core.architectures`` (the facade for model-architecture authors): importing it
warns once and gives the same objects. ``from hetero_core.architectures import ...`` is the way."""

import warnings

from hetero_core import architectures as _architectures

__all__ = list(_architectures.__all__)

warnings.warn(
    "hetero_core.models is now hetero_core.architectures; import from there (the old name will go)",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str):
    return getattr(_architectures, name)  # lazy names (torch-backed building blocks) stay lazy
