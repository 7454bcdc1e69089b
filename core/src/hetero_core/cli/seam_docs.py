"""The seam lists and counts in the docs, generated from ``plugin_system/seams.py``'s ``SEAM_TABLE``.

A doc marks each generated piece with a named block, ``<!-- seams:NAME -->...<!-- /seams:NAME -->``
(inline or over lines); this module renders every block of ``FILES`` from the table and the facades'
``__all__``. ``tests/plugin_system/test_seam_docs.py`` fails when a committed file differs from what
this renders, so a new seam cannot leave a count or a list behind.

    python -m hetero_core.cli.seam_docs           # rewrite the blocks in place (from the repository root)
    python -m hetero_core.cli.seam_docs --check   # list the stale files, exit 1 if any
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Callable
from pathlib import Path

from hetero_core.plugin_system.seams import SEAM_TABLE

FILES = ("README.md", "CONTRIBUTING.md", "core/README.md", "docs/hooks.md", "docs/architecture.md")
BLOCK = re.compile(r"<!-- seams:(?P<name>[a-z-]+) -->(?P<body>.*?)<!-- /seams:(?P=name) -->", re.S)
NUMBERS = {
    2: "two",
    3: "three",
    4: "four",
    5: "five",
    6: "six",
    7: "seven",
    8: "eight",
    9: "nine",
    10: "ten",
    11: "eleven",
    12: "twelve",
}
ORDINALS = {
    5: "a fifth",
    6: "a sixth",
    7: "a seventh",
    8: "an eighth",
    9: "a ninth",
    10: "a tenth",
    11: "an eleventh",
    12: "a twelfth",
    13: "a thirteenth",
}
ARCHITECTURES = "hetero_core.architectures"  # no seam (a checkpoint's config.json picks it), but a facade


def count() -> str:
    return NUMBERS.get(len(SEAM_TABLE), str(len(SEAM_TABLE)))


def next_seam() -> str:
    """What a new seam would be: ``an eighth`` (kind of plugin)."""
    return ORDINALS.get(len(SEAM_TABLE) + 1, f"seam number {len(SEAM_TABLE) + 1} of the")


def names() -> str:
    return ", ".join(seam.label for seam in SEAM_TABLE)


def listed() -> str:
    labels = [f"the {seam.label}" for seam in SEAM_TABLE]
    return ", ".join(labels[:-1]) + " and " + labels[-1]


def facade_modules() -> str:
    return ", ".join(f"`{seam.facade.removeprefix('hetero_core.')}.py`" for seam in SEAM_TABLE)


def held_names(module_name: str) -> str:
    """A facade's ``__all__``, protocols marked (every name is loaded, those a facade loads on first use
    too, so the text does not depend on what ran before)."""
    module = importlib.import_module(module_name)
    return ", ".join(
        f"`{name}`" + (" (a protocol)" if getattr(getattr(module, name), "_is_protocol", False) else "")
        for name in module.__all__
    )


def facade_table() -> str:
    rows = ["| seam | import from | what it holds |", "|---|---|---|"]
    rows += [f"| {seam.label} | `{seam.facade}` | {held_names(seam.facade)} |" for seam in SEAM_TABLE]
    rows.append(
        f"| model architectures (no seam; `register_model_architectures`) | `{ARCHITECTURES}` | "
        f"{held_names(ARCHITECTURES)} |"
    )
    return "\n" + "\n".join(rows) + "\n"


RENDERERS: dict[str, Callable[[], str]] = {
    "count": count,  # seven
    "next": next_seam,  # an eighth
    "names": names,  # tokenizer, scheduler policy, ...
    "list": listed,  # the tokenizer, the scheduler policy, ... and the speculative proposer
    "facade-modules": facade_modules,  # `tokenizer.py`, `policy.py`, ...
    "facade-table": facade_table,  # docs/hooks.md's table of facades
}


def render(text: str, where: str = "") -> str:
    """``text`` with every seams block rendered afresh."""

    def block(match: re.Match) -> str:
        name = match["name"]
        if name not in RENDERERS:
            raise SystemExit(
                f"seam_docs: {where} has an unknown block 'seams:{name}'; the blocks are "
                f"{', '.join(RENDERERS)}"
            )
        return f"<!-- seams:{name} -->{RENDERERS[name]()}<!-- /seams:{name} -->"

    return BLOCK.sub(block, text)


def stale_files(root: Path) -> list[str]:
    return [name for name in FILES if render(text := (root / name).read_text(encoding="utf-8"), name) != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hetero_core.cli.seam_docs", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--check", action="store_true", help="only list the stale files (exit 1 if any)")
    parser.add_argument("--root", type=Path, default=Path("."), help="the repository root (default: here)")
    args = parser.parse_args(argv)
    missing = [name for name in FILES if not (args.root / name).is_file()]
    if missing:
        print(
            f"seam_docs: {', '.join(missing)} not found under {args.root}; run it from the repository root "
            "or pass --root",
            file=sys.stderr,
        )
        return 2
    stale = stale_files(args.root)
    if args.check:
        for name in stale:
            print(f"{name} is stale: run `python -m hetero_core.cli.seam_docs`")
        return 1 if stale else 0
    for name in stale:
        path = args.root / name
        path.write_text(render(path.read_text(encoding="utf-8"), name), encoding="utf-8")
        print(f"rewrote the seam blocks of {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
