"""The process's model architectures: those of the last engine built (``build_engine`` installs its
plugin set's, so the allow-list and plugins passed in tests count), else those of core and every
installed plugin, discovered on first use. Model loading looks ``config.json``'s architecture up here."""

from __future__ import annotations

from typing import Any

from hetero_core.plugin_system.architectures import ArchitectureRegistry, ModelArchitecture
from hetero_core.plugin_system.discovery import load_plugins

_installed: ArchitectureRegistry | None = None


def installed_architectures() -> ArchitectureRegistry:
    """The process's architectures (see the module docstring)."""
    global _installed
    if _installed is None:
        _installed = load_plugins().registry.architectures
    return _installed


def install_architectures(registry: ArchitectureRegistry | None) -> None:
    """Make ``registry`` the process's architectures (None: discover again on next use)."""
    global _installed
    _installed = registry


def architecture_of(config: Any) -> ModelArchitecture:
    """The registered architecture of a parsed config (``config.architecture``)."""
    return installed_architectures().get(config.architecture)
