"""Commands that plugins add to ``hetero`` (the ``register_commands`` hook), after core's own.

``build_parser`` adds them only when the command line names none of core's commands, so ``hetero
run`` never loads them. A plugin command runs like core's: a ``HeteroError`` is one line and exit 2,
and logging is configured (warnings, on stderr) before its handler runs. A command that this
repository ships in a distribution of its own (``hetero bench``: hetero-bench) and that is not
installed, or whose plugin failed to load, or that two plugins add, still parses: running it prints
one line saying why and what to do, and exits 2.
"""

from __future__ import annotations

import argparse
import sys

from hetero_core.errors import HeteroError

# command -> (the distribution that adds it, how to install that distribution)
SHIPPED_APART = {
    "bench": ("hetero-bench", "pip install ./bench in a checkout of Hetero (./scripts/setup.sh installs it)"),
}
SHIPPED_HELP = {"bench": "run a benchmark (needs the hetero-bench package)"}


def add_plugin_commands(commands: argparse._SubParsersAction) -> None:
    """Let every loaded plugin add its commands to ``commands`` (core's are there already). A name
    added twice is added by neither: core's own stays (with a warning); two plugins' fails when run."""
    from hetero_core.plugin_system.discovery import COMMANDS, load_plugins

    plugin_set = load_plugins()
    owners = {name: ["core"] for name in commands.choices}  # command -> who adds it
    for info in plugin_set.plugins:
        for name in info.components.get(COMMANDS, []):
            owners.setdefault(name, []).append(info.name)
    clashes = {name: plugins for name, plugins in owners.items() if len(plugins) > 1}
    for info in plugin_set.plugins:
        names = info.components.get(COMMANDS, [])
        if names and not any(name in clashes for name in names):
            for impl in plugin_set.manager.hook.register_commands.get_hookimpls():
                if impl.plugin_name == info.name:
                    impl.function(commands=commands)
    for name, plugins in clashes.items():
        others = " and ".join(repr(p) for p in plugins if p != "core")
        if plugins[0] == "core":
            print(
                f"hetero: warning: plugin {others} adds the command '{name}', which is core's; "
                "the plugin's commands are left out",
                file=sys.stderr,
            )
        else:
            _add_unavailable(
                commands,
                name,
                "(unavailable: added by more than one plugin)",
                f"command '{name}' is added by more than one plugin: {others}; uninstall one of them",
            )
    for name, (distribution, install) in SHIPPED_APART.items():
        if name not in owners:
            _add_unavailable(
                commands,
                name,
                SHIPPED_HELP[name],
                _not_installed(name, distribution, install, plugin_set.registry.failures),
            )


def _not_installed(name: str, distribution: str, install: str, failures) -> str:
    for failure in failures:
        if failure.distribution == distribution:
            return f"`hetero {name}` is unavailable: {failure.describe()}"
    return f"`hetero {name}` comes with the {distribution} package, which is not installed: {install}"


def _add_unavailable(commands: argparse._SubParsersAction, name: str, help: str, message: str) -> None:
    """A command that parses whatever follows it (``--help`` too) and fails with ``message``."""
    parser = commands.add_parser(name, help=help, add_help=False, prefix_chars="\0")
    parser.add_argument("arguments", nargs=argparse.REMAINDER)

    def unavailable(args: argparse.Namespace) -> int:
        raise HeteroError(message)

    parser.set_defaults(handler=unavailable)
