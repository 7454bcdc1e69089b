"""The ``hetero`` command: run prompts, list plugins, serve, benchmark. User mistakes: one line on
stderr, exit 2; Ctrl-C: exit 130, keeping what was printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import get_args

from hetero_core.cli_bench import add_bench_command
from hetero_core.cli_run import add_run_arguments, run_command
from hetero_core.cli_serve import add_serve_command
from hetero_core.errors import HeteroError
from hetero_core.seams import SEAM_TABLE

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
# Settings that get no generated flag: seams get --NAME flags below; the others get their own.
_NO_FLAG = {seam.name for seam in SEAM_TABLE} | {"plugins", "chat"}
_VERBOSE_LEVELS = {1: "info", 2: "debug"}


def console_main() -> None:
    """The ``hetero`` console script (and ``python -m hetero_core``)."""
    sys.exit(main(fast_exit=True))


def main(argv: list[str] | None = None, *, fast_exit: bool = False) -> int:
    """Run the ``hetero`` command line ``argv``; return its exit status. ``fast_exit``: once a command
    that wrote only to stdout/stderr (``hetero run``) is done, exit the process at once, skipping the
    interpreter's teardown of torch's modules (~0.2 s of a ~1.3 s ``hetero run``); exit handlers
    still run and the streams are flushed."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(only=next((a for a in argv if not a.startswith("-")), ""))
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _settings_warnings_as_lines(warnings.showwarning)
            code = args.handler(args)
    except HeteroError as exc:
        print(f"hetero: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stdout.flush()
        print(("\n" if sys.stderr.isatty() else "") + "hetero: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `hetero run ... | head -1`: the reader left; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if fast_exit and getattr(args, "skip_teardown", False):
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    import atexit
    import logging

    atexit._run_exitfuncs()  # what atexit would run at a normal exit (logging's flush among them)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``hetero`` parser. ``only``: fill in just that command's arguments (the one being run; the
    others keep their help line), sparing a start the imports the other commands' flags need."""

    def wanted(command: str) -> bool:
        return only is None or only == command

    parser = argparse.ArgumentParser(
        prog="hetero",
        description="Hetero: a plugin-based LLM inference engine (paged KV cache, continuous batching).",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = commands.add_parser("run", help="answer one prompt (streamed) or several (one batch)")
    if wanted("run"):
        add_run_arguments(run)
        add_settings_arguments(run)
    run.set_defaults(handler=run_command)

    plugins = commands.add_parser("plugins", help="list discovered plugins and what they register")
    if wanted("plugins"):
        plugins.add_argument("--json", action="store_true", help="machine-readable output")
        add_settings_arguments(plugins, only_plugins=True)
    plugins.set_defaults(handler=_plugins)
    add_serve_command(commands, with_arguments=wanted("serve"))
    add_bench_command(commands)
    return parser


def add_settings_arguments(parser: argparse.ArgumentParser, only_plugins: bool = False) -> None:
    """One flag per setting (``block_size`` -> ``--block-size``), so no option lacks a flag."""
    from hetero_core.settings import SHORT_FLAGS, HeteroSettings

    group = parser.add_argument_group("settings (override HETERO_* variables and the --config file)")
    group.add_argument("--config", metavar="FILE", help="settings file (TOML or JSON)")
    group.add_argument("--plugins", metavar="A,B", help="allow-list of installed plugins to load")
    if only_plugins:
        return
    group.add_argument("-v", "--verbose", action="count", default=0,
                       help="log request events (-v: info, -vv: debug); default: warnings only")
    for seam in SEAM_TABLE:
        group.add_argument(f"--{seam.name.replace('_', '-')}", metavar="NAME",
                           help=f"{seam.label} by name (default: {seam.default})")
    for name, field in HeteroSettings.model_fields.items():
        if name in _NO_FLAG:
            continue
        flag = "--" + name.replace("_", "-")
        if flag in parser._option_string_actions:
            continue
        shown = f"{field.description or name} (default: {field.default})" if field.default is not None else None
        if field.annotation is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=shown)
            continue
        choices = get_args(field.annotation) or None  # Literal["a", "b"] -> ("a", "b")
        if choices and not all(isinstance(c, str) for c in choices):
            choices = None
        flags = [flag, SHORT_FLAGS[name]] if name in SHORT_FLAGS else [flag]
        group.add_argument(*flags, dest=name, metavar=name.upper(), choices=choices, default=None,
                           help=shown or field.description)


def load_cli_settings(args: argparse.Namespace):
    from hetero_core.settings import HeteroSettings, load_settings

    overrides = {name: getattr(args, name, None) for name in HeteroSettings.model_fields}
    verbose = getattr(args, "verbose", 0)
    if verbose and overrides.get("log_level") is None:
        overrides["log_level"] = _VERBOSE_LEVELS[min(verbose, 2)]
    return load_settings(args.config, **overrides)


def _plugins(args: argparse.Namespace) -> int:
    import json

    from hetero_core.builder import check_allow_list
    from hetero_core.plugins import load_plugins

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
    return 0


def _settings_warnings_as_lines(show_other):
    """A ``warnings.showwarning`` printing settings warnings as one ``hetero: warning:`` line."""
    from hetero_core.settings import SettingsWarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if issubclass(category, SettingsWarning):
            print(f"hetero: warning: {message}", file=sys.stderr)
        else:
            show_other(message, category, filename, lineno, file, line)

    return show
