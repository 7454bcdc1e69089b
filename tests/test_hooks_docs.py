"""docs/hooks.md promises which fields plugins may read: keep the promise and the code in step."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from hetero_core.engine.batch import Batch, ExecutorOutput
from hetero_core.engine.sequence import Sequence
from hetero_core.executor import ExecutorContext
from hetero_core.tokenizer import TokenizerContext

DOCS = (Path(__file__).parent.parent / "docs" / "hooks.md").read_text(encoding="utf-8")
SECTION = DOCS.split("## What plugins may read", 1)[1]


def paragraph(title: str) -> str:
    start = SECTION.index(f"**{title}**")
    end = SECTION.find("\n\n**", start + 1)
    return SECTION[start:end if end != -1 else None]


def documented_names(text: str) -> set[str]:
    return {re.sub(r"\(.*", "", name) for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*(?:\(i\))?)`", text)}


@pytest.mark.parametrize(
    "cls, title",
    [(TokenizerContext, "`TokenizerContext`"), (ExecutorContext, "`ExecutorContext`"), (Batch, "`Batch`"),
     (ExecutorOutput, "`ExecutorOutput`")],
)
def test_every_field_handed_to_plugins_is_documented(cls, title):
    names = documented_names(paragraph(title))
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in names]
    assert not missing, f"{cls.__name__} fields missing from docs/hooks.md: {missing}"


def test_batch_helpers_are_documented():
    names = documented_names(paragraph("`Batch`"))
    public = [n for n, v in vars(Batch).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))]
    assert set(public) <= names, set(public) - names


def test_the_sequence_fields_a_policy_may_read_exist():
    names = documented_names(paragraph("The sequence a policy sees")) - {"priority", "SequenceStatus", "SamplingParams"}
    seq = Sequence(0, "r", "p", [1, 2], None, 0.0)
    missing = [n for n in names if not hasattr(seq, n)]
    assert names and not missing, missing
