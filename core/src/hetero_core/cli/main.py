"""The ``hetero`` command: run prompts, list plugins, serve, and the commands plugins add
(``hetero bench``, from hetero-bench). User mistakes: one line on stderr, exit 2; Ctrl-C: exit 130,
keeping what was printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from hetero_core import __version__
from hetero_core.cli.chat import add_chat_command
from hetero_core.cli.parser import HeteroParser
from hetero_core.cli.plugin_commands import add_plugin_commands
from hetero_core.cli.plugins import add_plugins_command
from hetero_core.cli.run import add_run_arguments, run_command
from hetero_core.cli.serve import add_serve_command
from hetero_core.cli.settings_args import add_settings_arguments
from hetero_core.cli.show_settings import add_settings_command
from hetero_core.errors import HeteroError

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
CORE_COMMANDS = ("run", "chat", "plugins", "settings", "serve")  # the plugins' commands come after these


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
    if args.command not in CORE_COMMANDS:  # a plugin's: logging as `hetero run` sets it by default
        from hetero_core.logging import configure_logging

        configure_logging(level="warning")
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
    others keep their help line), sparing a start the imports the other commands' flags need; when
    it names a core command, the plugins' commands (``register_commands``) are not loaded at all."""

    def wanted(command: str) -> bool:
        return only is None or only == command

    parser = HeteroParser(
        prog="hetero",
        description="Hetero: a plugin-based LLM inference engine (paged KV cache, continuous batching).",
    )
    parser.add_argument("--version", action="version", version=f"hetero {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = commands.add_parser("run", help="answer one prompt (streamed) or several (one batch)")
    if wanted("run"):
        add_run_arguments(run)
        add_settings_arguments(run)
    run.set_defaults(handler=run_command)

    add_chat_command(commands, with_arguments=wanted("chat"))
    add_plugins_command(commands, with_arguments=wanted("plugins"))
    add_settings_command(commands, with_arguments=wanted("settings"))
    add_serve_command(commands, with_arguments=wanted("serve"))
    if only not in CORE_COMMANDS:
        add_plugin_commands(commands)
    return parser


def _settings_warnings_as_lines(show_other):
    """A ``warnings.showwarning`` printing settings warnings as one ``hetero: warning:`` line."""
    from hetero_core.settings import SettingsWarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if issubclass(category, SettingsWarning):
            print(f"hetero: warning: {message}", file=sys.stderr)
        else:
            show_other(message, category, filename, lineno, file, line)

    return show
