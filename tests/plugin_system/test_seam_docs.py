"""The seam lists and counts in the docs cannot drift from ``SEAM_TABLE``: the generated blocks
(``hetero_core.cli.seam_docs``) are up to date, the hand-written lists that remain (architecture.md's
seams table, the settings docstring) are checked against the table, and no count is left outside."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import hetero_core.settings
from hetero_core.cli import seam_docs
from hetero_core.plugin_system.seams import SEAM_TABLE, SEAMS

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = "run `.venv/bin/python -m hetero_core.cli.seam_docs` from the repository root"


@pytest.mark.parametrize("name", seam_docs.FILES)
def test_the_generated_seam_blocks_are_up_to_date(name):
    text = (ROOT / name).read_text(encoding="utf-8")
    assert seam_docs.BLOCK.search(text), f"{name} has no seams block"
    assert seam_docs.render(text, name) == text, f"{name}: a seams block is stale; {REGENERATE}"


def test_the_blocks_render_from_the_table():
    assert seam_docs.count() == "seven" and seam_docs.next_seam() == "an eighth"
    assert seam_docs.listed().startswith("the tokenizer, the scheduler policy, ")
    table = seam_docs.facade_table()
    for seam in SEAM_TABLE:
        assert f"| {seam.label} | `{seam.facade}` |" in table
    assert "`TokenizerContext`" in table and "`LlamaForCausalLM`" in table


def test_a_stale_block_is_rewritten_and_an_unknown_one_refused():
    stale = "four seams: <!-- seams:count -->four<!-- /seams:count -->"
    assert seam_docs.render(stale) == "four seams: <!-- seams:count -->seven<!-- /seams:count -->"
    with pytest.raises(SystemExit, match="unknown block 'seams:counts'; the blocks are count, next"):
        seam_docs.render("<!-- seams:counts -->x<!-- /seams:counts -->", "README.md")


def test_the_check_lists_a_stale_file(tmp_path, capsys):
    for name in seam_docs.FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text(encoding="utf-8"), encoding="utf-8")
    assert seam_docs.main(["--check", "--root", str(tmp_path)]) == 0
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("-->seven<!--", "-->four<!--", 1))
    assert seam_docs.main(["--check", "--root", str(tmp_path)]) == 1
    assert "README.md is stale" in capsys.readouterr().out
    assert seam_docs.main(["--root", str(tmp_path)]) == 0 and seam_docs.stale_files(tmp_path) == []


def test_no_seam_count_is_written_outside_a_block():
    words = (
        "|".join(seam_docs.NUMBERS.values())
        + "|"
        + "|".join(o.split()[1] for o in seam_docs.ORDINALS.values())
    )
    counted = re.compile(rf"\b({words})(?: seam| kind of plugin)", re.I)
    for name in (*seam_docs.FILES, "docs/quickstart.md", "docs/python-api.md"):
        text = seam_docs.BLOCK.sub("", (ROOT / name).read_text(encoding="utf-8"))
        assert not counted.search(text), (
            f"{name}: {counted.search(text)[0]!r} is a seam count outside a block"
        )


def test_architecture_md_seams_table_has_one_row_per_seam():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    start = text.index("| seam | default (core) | other implementations |")
    rows = [
        line.split(" | ")[0].removeprefix("| ")
        for line in text[start : text.index("\n\n", start)].splitlines()[2:]
    ]
    spelled = {name: {seam.label, seam.name.replace("_", " ")} for name, seam in zip(SEAMS, SEAM_TABLE)}
    assert sorted(rows) == sorted(next(iter(s & {r for r in rows}), name) for name, s in spelled.items())


def test_the_settings_docstring_names_every_seam_field():
    listed = re.search(
        r"one field per seam of ``seams.SEAM_TABLE``: (.*?)\)", hetero_core.settings.__doc__, re.S
    )[1]
    assert re.findall(r"``(\w+)``", listed) == list(SEAMS)
