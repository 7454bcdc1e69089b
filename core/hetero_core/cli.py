"""The ``hetero`` command: run prompts, list plugins. User mistakes: one line on stderr, exit 2."""

from __future__ import annotations

import argparse
import sys
import time
from typing import get_args

from hetero_core.cli_serve import add_serve_command
from hetero_core.errors import HeteroError

EXIT_USAGE = 2
# Settings that get no generated flag: component tables get --NAME flags below; lists get their own.
_NO_FLAG = {"tokenizer", "scheduler_policy", "kv_allocator", "executor", "plugins"}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.handler(args)
    except HeteroError as exc:
        print(f"hetero: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hetero", description="Hetero: a plugin-based LLM inference engine (paged KV cache, continuous batching)."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = commands.add_parser("run", help="generate text for one or more prompts")
    run.add_argument("prompts", nargs="*", metavar="PROMPT", help="prompt text (several run as one batch)")
    run.add_argument("--input", action="append", default=[], metavar="TEXT", help="a prompt (repeatable)")
    run.add_argument("--chat", action="store_true", default=None, help="apply the model's chat template")
    run.add_argument("--stop", action="append", default=None, metavar="TEXT", help="stop string (repeatable)")
    run.add_argument("--ignore-eos", action="store_true", help="keep generating past EOS")
    add_settings_arguments(run)
    run.set_defaults(handler=_run)

    plugins = commands.add_parser("plugins", help="list discovered plugins and what they register")
    plugins.add_argument("--json", action="store_true", help="machine-readable output")
    add_settings_arguments(plugins, only_plugins=True)
    plugins.set_defaults(handler=_plugins)
    add_serve_command(commands)
    return parser


def add_settings_arguments(parser: argparse.ArgumentParser, only_plugins: bool = False) -> None:
    """One flag per setting (``block_size`` -> ``--block-size``), so no option lacks a flag."""
    from hetero_core.settings import HeteroSettings

    group = parser.add_argument_group("settings (override HETERO_* variables and the --config file)")
    group.add_argument("--config", metavar="FILE", help="settings file (TOML or JSON)")
    group.add_argument("--plugins", metavar="A,B", help="allow-list of installed plugins to load")
    if only_plugins:
        return
    for seam in ("executor", "tokenizer", "scheduler_policy", "kv_allocator"):
        group.add_argument(f"--{seam.replace('_', '-')}", metavar="NAME", help=f"{seam.replace('_', ' ')} by name")
    for name, field in HeteroSettings.model_fields.items():
        if name in _NO_FLAG:
            continue
        flag = "--" + name.replace("_", "-")
        if flag in parser._option_string_actions:
            continue
        choices = get_args(field.annotation) or None
        if field.annotation is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=field.description)
        else:
            group.add_argument(flag, metavar=name.upper(), choices=choices if choices and all(isinstance(c, str) for c in choices) else None,
                               default=None, help=field.description)


def load_cli_settings(args: argparse.Namespace):
    from hetero_core.settings import HeteroSettings, load_settings

    overrides = {name: getattr(args, name, None) for name in HeteroSettings.model_fields}
    return load_settings(args.config, **overrides)


def _plugins(args: argparse.Namespace) -> int:
    import json

    from hetero_core.plugins import load_plugins

    settings = load_cli_settings(args)
    plugin_set = load_plugins(allow=settings.plugins)
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


def _run(args: argparse.Namespace) -> int:
    from hetero_core.builder import build_engine, default_sampling_params
    from hetero_core.logging import configure_logging

    prompts = list(args.prompts) + list(args.input)
    if not prompts:
        raise HeteroError("no prompt given; pass PROMPT or --input TEXT")
    settings = load_cli_settings(args)
    configure_logging(settings.log_format, settings.log_level)
    params = default_sampling_params(settings, stop=args.stop, ignore_eos=args.ignore_eos or None)
    started = time.perf_counter()
    engine = build_engine(settings)
    loaded = time.perf_counter()
    chat = settings.chat
    inputs = [[{"role": "user", "content": p}] if chat else p for p in prompts]
    outputs = engine.generate(inputs, params)
    elapsed = time.perf_counter() - loaded
    engine.shutdown()
    failed = 0
    for prompt, out in zip(prompts, outputs):
        if len(prompts) > 1:
            print(f"=== {prompt}")
        if out.error:
            failed += 1
            print(f"hetero: request failed: {out.error}", file=sys.stderr)
        else:
            print(out.text)
    num_tokens = sum(len(o.output_token_ids) for o in outputs)
    print(
        f"--- {num_tokens} tokens in {elapsed:.2f}s ({num_tokens / elapsed if elapsed else 0:.1f} tokens/s), "
        f"{len(outputs)} request(s), load {loaded - started:.2f}s",
        file=sys.stderr,
    )
    return 1 if failed else 0
