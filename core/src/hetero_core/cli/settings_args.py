"""Every setting as a flag (``block_size`` -> ``--block-size``), and the settings a command line gives:
flags over ``HETERO_*`` variables over the ``--config`` file over defaults."""

from __future__ import annotations

import argparse
from typing import get_args

from hetero_core.plugin_system.seams import SEAM_TABLE
from hetero_core.validation import as_number, is_number_field

# Settings that get no generated flag: seams get --NAME flags below; the others get their own.
_NO_FLAG = {seam.name for seam in SEAM_TABLE} | {"plugins", "chat", "reuse_server"}
_VERBOSE_LEVELS = {1: "info", 2: "debug"}


def add_settings_arguments(parser: argparse.ArgumentParser, only_plugins: bool = False) -> None:
    """One flag per setting (``block_size`` -> ``--block-size``), so no option lacks a flag."""
    from hetero_core.settings import SHORT_FLAGS, HeteroSettings

    group = parser.add_argument_group("settings (override HETERO_* variables and the --config file)")
    group.add_argument("--config", metavar="FILE", help="settings file (TOML or JSON)")
    group.add_argument("--plugins", metavar="A,B", help="allow-list of installed plugins to load")
    if only_plugins:
        return
    group.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log request events (-v: info, -vv: debug); default: warnings only",
    )
    for seam in SEAM_TABLE:
        group.add_argument(
            f"--{seam.name.replace('_', '-')}",
            metavar="NAME",
            help=f"{seam.label} by name (default: {seam.default})",
        )
    for name, field in HeteroSettings.model_fields.items():
        if name in _NO_FLAG:
            continue
        flag = "--" + name.replace("_", "-")
        if flag in parser._option_string_actions:
            continue
        shown = (
            f"{field.description or name} (default: {field.default})" if field.default is not None else None
        )
        if field.annotation is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=shown)
            continue
        choices = get_args(field.annotation) or None  # Literal["a", "b"] -> ("a", "b")
        if choices and not all(isinstance(c, str) for c in choices):
            choices = None
        flags = [flag, SHORT_FLAGS[name]] if name in SHORT_FLAGS else [flag]
        kind = as_number if is_number_field(field.annotation) else None  # `got -4`, not `got '-4'`
        group.add_argument(
            *flags,
            dest=name,
            metavar=name.upper(),
            choices=choices,
            default=None,
            type=kind,
            help=shown or field.description,
        )


def add_reuse_server_argument(parser: argparse.ArgumentParser, help: str) -> None:
    """``--reuse-server`` / ``--no-reuse-server``: the ``reuse_server`` setting, for the two commands
    it applies to (``hetero run`` and ``hetero serve``)."""
    parser.add_argument(
        "--reuse-server",
        dest="reuse_server",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=help + " (default: true; HETERO_REUSE_SERVER)",
    )


def load_cli_settings(args: argparse.Namespace):
    from hetero_core.settings import HeteroSettings, load_settings

    overrides = {name: getattr(args, name, None) for name in HeteroSettings.model_fields}
    verbose = getattr(args, "verbose", 0)
    if verbose and overrides.get("log_level") is None:
        overrides["log_level"] = _VERBOSE_LEVELS[min(verbose, 2)]
    return load_settings(args.config, **overrides)
