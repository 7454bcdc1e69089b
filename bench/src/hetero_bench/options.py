"""Options several benchmarks share: argument types, the engine flags, settings from them."""

from __future__ import annotations

import argparse

from hetero_core import HeteroError


def bench_parser_class(base: type[argparse.ArgumentParser]) -> type[argparse.ArgumentParser]:
    """A benchmark's parser class: ``base``, the class ``hetero`` makes its commands' parsers of (a
    misspelt flag names the closest one), its mistakes one line (``HeteroError``: the CLI exits 2)."""

    class BenchParser(base):
        def error(self, message: str):
            raise HeteroError(f"{self.prog}: {message}")

    return BenchParser


def positive_int(text: str) -> int:
    return _int(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    return _int(text, 0, "an integer >= 0")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")  # a number: unquoted
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def _int(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
    return value


def add_engine_arguments(parser: argparse.ArgumentParser, default_executor: str = "torch") -> None:
    """--model, --executor, --dtype, --config: the engine under test (HETERO_* variables apply too)."""
    group = parser.add_argument_group("engine")
    group.add_argument(
        "--model",
        help="embedded model name, HF directory, .gguf file or hub id "
        "(default: the embedded SmolLM2-135M-Instruct), or random:SHAPE[:DTYPE], "
        "random weights of a shape made once in the cache (random:smollm2-360m, "
        "random:llama-1b:float32; random_models.py)",
    )
    group.add_argument(
        "--executor",
        default=default_executor,
        metavar="NAME",
        help=f"executor by name (default: {default_executor}; mock: no model, fast)",
    )
    group.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="the executor's compute dtype (default: the executor's own)",
    )
    group.add_argument("--config", metavar="FILE", help="settings file (TOML or JSON) for the engine")


def engine_settings(args: argparse.Namespace, executor_options: dict | None = None, **fixed):
    """Settings for the engine under test: the benchmark's fixed ones, then the flags, over the usual
    sources (HETERO_* variables, --config, defaults). ``executor_options``: the executor's section."""
    from hetero_core import load_settings

    flags = {
        name: getattr(args, name) for name in ("model", "executor", "dtype") if getattr(args, name, None)
    }
    if "model" in flags:
        flags["model"] = model_path(flags["model"])
    if executor_options:
        name = flags.get("executor") or fixed.get("executor")
        flags["executor"] = {"name": name, name: executor_options}
    return load_settings(args.config, **{**fixed, **flags})


def engine_flags(args: argparse.Namespace) -> list[str]:
    """The same engine flags for a `hetero` subprocess (``hetero serve``, ``hetero run``)."""
    flags = []
    for name in ("model", "executor", "dtype", "config"):
        value = getattr(args, name, None)
        if value:
            flags += [f"--{name}", str(model_path(value) if name == "model" else value)]
    return flags


def model_path(model: str) -> str:
    """``--model`` as the engine takes it: a ``random:`` spec made (once) into its directory."""
    from hetero_bench.random_models import is_random_spec, resolve_random_model

    return str(resolve_random_model(model)) if is_random_spec(model) else model
