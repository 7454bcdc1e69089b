"""``hetero plugins``: what is installed, what each plugin registers, and what failed to load."""

from __future__ import annotations

import argparse

from hetero_core.cli.settings_args import add_settings_arguments, load_cli_settings


def add_plugins_command(commands, *, with_arguments: bool = True) -> None:
    plugins = commands.add_parser("plugins", help="list discovered plugins and what they register")
    if with_arguments:
        plugins.add_argument("--json", action="store_true", help="machine-readable output")
        add_settings_arguments(plugins, only_plugins=True)
    plugins.set_defaults(handler=plugins_command)


def plugins_command(args: argparse.Namespace) -> int:
    import json

    from hetero_core.builder import check_allow_list
    from hetero_core.plugin_system.discovery import load_plugins

    settings = load_cli_settings(args)
    plugin_set = load_plugins(allow=settings.plugins)
    check_allow_list(settings.plugins, plugin_set)
    if args.json:
        print(json.dumps([p.as_dict() for p in plugin_set.plugins], indent=2))
        return 0
    for info in plugin_set.plugins:
        version = f" {info.version}" if info.version else ""
        dist = f" ({info.distribution}{version})" if info.distribution else ""
        print(f"{info.name}{dist}: {info.status}")
        for seam, names in info.components.items():
            print(f"    {seam}: {', '.join(names)}")
        if info.error:
            print(f"    error: {info.error}")
    for (seam, name), owners in plugin_set.registry.conflicts.items():
        print(f"conflict: {seam} '{name}' registered by {', '.join(owners)}")
    for name, owners in plugin_set.registry.architectures.conflicts.items():
        print(f"conflict: architecture '{name}' registered by {', '.join(owners)}")
    return 0
