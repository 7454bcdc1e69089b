"""docs/architecture.md's rooms table against the tree: it lists every room of core (a folder or a
root module of ``hetero_core``) exactly once, imports run down its rows, and each row's "imports"
column names every room its rooms import (the floor, its last row, goes without saying) and no
room they do not."""

from __future__ import annotations

import re
from pathlib import Path

from tests.import_graph import core_rooms, import_graph

DOC = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
FACADES = tuple(
    f"hetero_core.{m}"
    for m in (
        "executor",
        "policy",
        "kv",
        "structured_output",
        "kv_transfer",
        "speculative",
        "models",
        "tokenizer",
    )
)
NOT_ROOMS = {"hetero_core.__main__"}  # ``python -m hetero_core``: the CLI's entry


def split_top_level(text: str) -> list[str]:
    """``text`` split at commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


def documented_rows() -> list[tuple[list[str], set[str]]]:
    """(the rooms of a row, the rooms its "imports" column names), top row first."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index("| room | what it holds | imports (rooms) |")
    rows = []
    for line in text[start : text.index("\n\n", start)].splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        rooms = [f"hetero_core.{name}" for name in re.findall(r"`([a-z_]+)(?:/|\.py)`", cells[0])]
        imports: set[str] = set()
        for part in split_top_level(cells[-1]):
            word = re.sub(r"\(.*", "", part).strip()
            if word == "the facades":
                imports |= set(FACADES)
            elif word and not word.startswith("nothing"):
                imports.add(f"hetero_core.{word}")
        rows.append((rooms, imports))
    return rows


ROWS = documented_rows()
ROOMS = {room: arrows for room, arrows in core_rooms(import_graph()).items() if room not in NOT_ROOMS}
ROW_OF = {room: index for index, (rooms, _) in enumerate(ROWS) for room in rooms}


def test_the_table_lists_every_room_of_core_once():
    listed = [room for rooms, _ in ROWS for room in rooms]
    assert sorted(listed) == sorted(set(listed)), "a room is listed twice"
    assert set(listed) == set(ROOMS), (
        f"missing from docs/architecture.md: {sorted(set(ROOMS) - set(listed))}; "
        f"listed but not in core/src/hetero_core: {sorted(set(listed) - set(ROOMS))}"
    )


def test_imports_run_down_the_table():
    upward = [f"{a} -> {b}" for a, targets in ROOMS.items() for b in targets if ROW_OF[b] < ROW_OF[a]]
    assert upward == []


def test_each_row_names_the_rooms_it_imports():
    floor = set(ROWS[-1][0])
    for rooms, documented in ROWS:
        actual = set().union(*(ROOMS[room] for room in rooms)) - set(rooms)
        missing = actual - documented - floor
        assert not missing, f"docs/architecture.md: the row of {rooms} does not name {sorted(missing)}"
        stale = documented - actual - set(FACADES)  # "the facades": any of them
        assert not stale, (
            f"docs/architecture.md: the row of {rooms} names {sorted(stale)}, which it does not import"
        )


def test_the_parser_reads_the_rows():
    cli = next(imports for rooms, imports in ROWS if rooms == ["hetero_core.cli"])
    assert {"hetero_core.server", "hetero_core.model"} <= cli
    assert "hetero_core.errors" in ROWS[-1][0] and "hetero_core.cache" in ROWS[-1][0]
