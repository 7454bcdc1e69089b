"""Plugin discovery: core's defaults plus every installed ``hetero`` entry point.

A plugin that fails to import, fails pluggy's signature validation, implements a hook that is not a
hetero hook (a misspelt ``register_scheduler_policy``: pluggy's ``check_pending``), raises while
registering or registers something ``checks.check_registration`` refuses (a bad name, factory,
options model or trait) is recorded as a failure; the other plugins keep working, and selecting a
component from the broken one raises an error that names it, its version and the cause.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import pluggy

from hetero_core.plugin_system import hookspecs
from hetero_core.plugin_system.architectures import ModelArchitecture
from hetero_core.plugin_system.checks import check_registration
from hetero_core.plugin_system.registry import SEAMS, Component, PluginFailure, Registry, distribution_label
from hetero_core.plugin_system.seams import SEAM_TABLE
from hetero_core.suggest import did_you_mean

ENTRY_POINT_GROUP = "hetero"
AUTOLOAD_ENV = "HETERO_DISABLE_PLUGIN_AUTOLOAD"
# Core's own components, loaded by name like pytest's built-in plugins, before any installed plugin; they
# register through the same hooks (the plugin system knows them only by module name).
BUILTIN_PLUGINS = {"core": "hetero_core.default_plugins"}
HOOK_FOR_SEAM = {seam.name: seam.hook for seam in SEAM_TABLE}
COMMANDS = "command"  # PluginInfo.components key for the subcommands a plugin adds (register_commands)
ARCHITECTURES = "architecture"  # PluginInfo.components key for its model architectures


@dataclass
class PluginInfo:
    name: str
    distribution: str | None = None
    version: str | None = None
    status: str = "loaded"  # loaded | failed | not allowed
    error: str | None = None
    components: dict[str, list[str]] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status,
            "error": self.error,
            "components": self.components,
        }


@dataclass
class PluginSet:
    manager: pluggy.PluginManager
    registry: Registry
    plugins: list[PluginInfo]


def load_plugins(
    allow: Iterable[str] | None = None,
    entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
    extra_plugins: Iterable[tuple[str, object]] = (),
) -> PluginSet:
    """Build a fresh plugin manager and registry.

    ``allow``: names of entry-point plugins that may load (None: all). Core always loads.
    ``entry_points``: override discovery (tests pass fake distributions' entry points).
    ``extra_plugins``: (name, module-or-object) registered directly, as if installed.
    """
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    registry = Registry()
    infos: list[PluginInfo] = []
    allowed = None if allow is None else set(allow)

    candidates: list[tuple[PluginInfo, object]] = [
        (PluginInfo(name, *_core_dist()), importlib.import_module(module))
        for name, module in BUILTIN_PLUGINS.items()
    ]
    if entry_points is None:
        entry_points = _discover() if not os.environ.get(AUTOLOAD_ENV) else []
    for ep in sorted(entry_points, key=lambda e: e.name):
        dist = getattr(ep, "dist", None)
        info = PluginInfo(ep.name, dist.name if dist else None, dist.version if dist else None)
        if allowed is not None and ep.name not in allowed:
            info.status = "not allowed"
            infos.append(info)
            continue
        try:
            candidates.append((info, ep.load()))
        except Exception as exc:  # a broken optional plugin must not block the others
            _fail(info, registry, f"{type(exc).__name__}: {exc}")
            infos.append(info)
    candidates.extend((PluginInfo(name), obj) for name, obj in extra_plugins)

    for info, plugin in candidates:
        infos.append(info)
        try:
            manager.register(plugin, name=info.name)
        except Exception as exc:
            _fail(info, registry, str(exc))
            continue
        try:
            _check_hook_names(manager, plugin)
            components = _collect(manager, info)
            commands = _collect_commands(manager, info)
            architectures = _collect_architectures(manager, info)
        except Exception as exc:
            manager.unregister(name=info.name)
            _fail(info, registry, str(exc))
            continue
        for component in components:
            registry.add(component)
            info.components.setdefault(component.seam, []).append(component.name)
        for name, architecture in architectures:
            registry.architectures.add(name, architecture, info.name)
        if architectures:
            info.components[ARCHITECTURES] = [name for name, _ in architectures]
        idle = None if components or commands or architectures else _idle_reason(manager, plugin)
        if idle:
            registry.idle.append(
                f"plugin '{info.name}'{distribution_label(info.distribution, info.version)} {idle}"
            )
        if commands:
            info.components[COMMANDS] = commands
    return PluginSet(manager, registry, infos)


def _check_hook_names(manager: pluggy.PluginManager, plugin: object) -> None:
    """pluggy's ``check_pending`` for the plugin just registered (the ones before it passed): a
    hook implementation with no hook spec of that name is a typo, refused in one line."""
    try:
        manager.check_pending()
    except pluggy.PluginValidationError:
        unknown = [c.name for c in manager.get_hookcallers(plugin) or [] if not c.has_spec()]
        if not unknown:  # not this plugin's (cannot happen: every plugin before it passed)
            raise
        hook = unknown[0]
        specs = sorted(name for name, caller in vars(manager.hook).items() if caller.has_spec())
        raise ValueError(
            f"implements {hook}, which is not a hetero hook{did_you_mean(hook, specs)} "
            f"(hooks: {', '.join(specs)})"
        ) from None


def _idle_reason(manager: pluggy.PluginManager, plugin: object) -> str | None:
    """Why a plugin that loaded registered no component (for ``unknown executor 'x'`` messages), or
    None when it implements only hooks that register no component."""
    hooks = sorted(c.name for c in manager.get_hookcallers(plugin) or [])
    seam_hooks = [h for h in hooks if h in HOOK_FOR_SEAM.values()]
    if not hooks:
        return "implements no hetero hook"
    if seam_hooks:
        return f"ran {', '.join(seam_hooks)} without calling register()"
    return None


def _collect(manager: pluggy.PluginManager, info: PluginInfo) -> list[Component]:
    """Call this plugin's register hooks; all or nothing (raises on the first failure)."""
    collected: list[Component] = []
    for seam in SEAMS:
        hook = getattr(manager.hook, HOOK_FOR_SEAM[seam])
        for impl in hook.get_hookimpls():
            if impl.plugin_name != info.name:
                continue

            def register(name, factory, *, options=None, _seam=seam, **traits):
                check_registration(_seam, name, factory, options, traits)
                collected.append(Component(_seam, name, factory, info.name, options, traits))

            try:
                impl.function(register=register)
            except Exception as exc:
                raise RuntimeError(f"{HOOK_FOR_SEAM[seam]} raised {type(exc).__name__}: {exc}") from exc
    return collected


def _collect_architectures(
    manager: pluggy.PluginManager, info: PluginInfo
) -> list[tuple[str, ModelArchitecture]]:
    """The model architectures this plugin registers (``register_model_architectures``); a name that
    is not an identifier or a value that is not a ``ModelArchitecture`` fails the plugin."""
    collected: list[tuple[str, ModelArchitecture]] = []

    def register(name, architecture):
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(
                f"architecture name {name!r} must be the config.json 'architectures' entry, "
                "e.g. 'Phi3ForCausalLM'"
            )
        if not isinstance(architecture, ModelArchitecture):
            raise ValueError(
                f"architecture '{name}': register a hetero_core.architectures.ModelArchitecture, "
                f"got {type(architecture).__name__}"
            )
        collected.append((name, architecture))

    for impl in manager.hook.register_model_architectures.get_hookimpls():
        if impl.plugin_name != info.name:
            continue
        try:
            impl.function(register=register)
        except Exception as exc:
            raise RuntimeError(f"register_model_architectures raised {type(exc).__name__}: {exc}") from exc
    return collected


def _collect_commands(manager: pluggy.PluginManager, info: PluginInfo) -> list[str]:
    """The ``hetero`` subcommands this plugin adds (``register_commands``), added here to a scratch
    parser: a command that fails to build fails its plugin at discovery, where ``hetero plugins``
    shows it. The CLI adds them to its own parser (``hetero_core.cli.plugin_commands``)."""
    import argparse

    commands = argparse.ArgumentParser(prog="hetero").add_subparsers()
    for impl in manager.hook.register_commands.get_hookimpls():
        if impl.plugin_name != info.name:
            continue
        try:
            impl.function(commands=commands)
        except Exception as exc:
            raise RuntimeError(f"register_commands raised {type(exc).__name__}: {exc}") from exc
    for name, parser in commands.choices.items():
        if not callable(parser.get_default("handler")):
            raise RuntimeError(
                f"register_commands: command '{name}' has no handler; "
                "call set_defaults(handler=fn) on its parser"
            )
    return list(commands.choices)


def _fail(info: PluginInfo, registry: Registry, error: str) -> None:
    info.status, info.error = "failed", error
    registry.failures.append(PluginFailure(info.name, info.distribution, info.version, error))


def _discover() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def _core_dist() -> tuple[str, str | None]:
    try:
        return "hetero-core", importlib.metadata.version("hetero-core")
    except importlib.metadata.PackageNotFoundError:
        return "hetero-core", None
