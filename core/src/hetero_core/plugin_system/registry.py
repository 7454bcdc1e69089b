"""Registry: every component of every seam, by name, with the plugin that registered it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from hetero_core.errors import ConfigError, PluginError, UnknownComponentError
from hetero_core.plugin_system.architectures import ArchitectureRegistry
from hetero_core.plugin_system.seams import SEAM_BY_NAME, SEAMS
from hetero_core.suggest import did_you_mean
from hetero_core.validation import describe_validation_error

__all__ = ["SEAMS", "Component", "PluginFailure", "Registry", "distribution_label"]


@dataclass(frozen=True)
class Component:
    seam: str
    name: str
    factory: Callable[..., Any]
    plugin: str
    options: type | None = None  # a pydantic model validating this component's settings section
    traits: dict[str, Any] = field(default_factory=dict)

    def validate_options(self, section: dict[str, Any] | None):
        """Validate this component's settings section with its own model (None if it has none)."""
        section = section or {}
        label = f"{self.seam}.{self.name}"
        if self.options is None:
            if section:
                raise ConfigError(f"{label}: this component takes no options (got {', '.join(section)})")
            return None
        try:
            return self.options(**section)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc, label, self.options.model_fields)) from None


@dataclass(frozen=True)
class PluginFailure:
    plugin: str
    distribution: str | None
    version: str | None
    error: str

    def describe(self) -> str:
        where = distribution_label(self.distribution, self.version)
        return f"plugin '{self.plugin}'{where} failed to load: {self.error}"


def distribution_label(distribution: str | None, version: str | None) -> str:
    """`` (hetero-x 1.0)`` after a plugin's name, or "" for a plugin not installed from a distribution."""
    if not distribution:
        return ""
    return f" ({distribution} {version})" if version else f" ({distribution})"


class Registry:
    def __init__(self) -> None:
        self._components: dict[str, dict[str, Component]] = {seam: {} for seam in SEAMS}
        self.conflicts: dict[tuple[str, str], list[str]] = {}
        self.failures: list[PluginFailure] = []
        self.idle: list[str] = []  # plugins that loaded but registered no component, and why
        self.architectures = ArchitectureRegistry()  # model architectures (register_model_architectures)

    def add(self, component: Component) -> None:
        seam_components = self._components[component.seam]
        key = (component.seam, component.name)
        existing = seam_components.get(component.name)
        if existing is not None or key in self.conflicts:
            owners = self.conflicts.setdefault(key, [existing.plugin] if existing else [])
            owners.append(component.plugin)
            seam_components.pop(component.name, None)
            return
        seam_components[component.name] = component

    def names(self, seam: str) -> list[str]:
        conflicted = [name for (s, name) in self.conflicts if s == seam]
        return sorted(set(self._components[seam]) | set(conflicted))

    def get(self, seam: str, name: str) -> Component:
        label = SEAM_BY_NAME[seam].label
        if (seam, name) in self.conflicts:
            owners = " and ".join(f"'{p}'" for p in self.conflicts[(seam, name)])
            raise PluginError(
                f"{label} '{name}' is registered by more than one plugin: {owners}; "
                "uninstall one of them or restrict plugins with the 'plugins' allow-list"
            )
        component = self._components[seam].get(name)
        if component is not None:
            return component
        for failure in self.failures:
            if failure.plugin == name or (failure.distribution or "").endswith(f"-{name}"):
                raise PluginError(f"{label} '{name}' is unavailable: {failure.describe()}")
        message = f"unknown {label} '{name}'; available: {', '.join(self.names(seam)) or '(none)'}"
        message += did_you_mean(name, self.names(seam))
        if self.failures:
            message += "; " + "; ".join(f.describe() for f in self.failures)
        if self.idle:
            message += "; loaded without registering anything: " + "; ".join(self.idle)
        raise UnknownComponentError(message)
