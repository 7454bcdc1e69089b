"""docs/hooks.md promises which fields plugins may read and documents every hook and trait: keep the
promise and the code in step (datasette's "every hook is documented" meta-test)."""

from __future__ import annotations

import dataclasses
import re
import types
from pathlib import Path

import pytest

from hetero_core.executor import Batch, ExecutorCapabilities, ExecutorContext, ExecutorOutput
from hetero_core.kv_transfer import KVConnectorContext
from hetero_core.plugin_system import hookspecs
from hetero_core.plugin_system.seams import SEAM_TABLE
from hetero_core.policy import RequestView, SchedulerSnapshot, SchedulingDecision
from hetero_core.speculative import ProposalInput, ProposerContext
from hetero_core.structured_output import StructuredOutputContext
from hetero_core.testing import ExecutorContract
from hetero_core.tokenizer import TokenizerContext

DOCS = (Path(__file__).parents[2] / "docs" / "hooks.md").read_text(encoding="utf-8")
SECTION = DOCS.split("## What plugins may read", 1)[1]


def paragraph(title: str) -> str:
    start = SECTION.index(f"**{title}**")
    end = SECTION.find("\n\n**", start + 1)
    return SECTION[start : end if end != -1 else None]


def hook_section(hook: str) -> str:
    start = DOCS.index(f"## `{hook}(register)`")
    return DOCS[start : DOCS.find("\n## ", start + 1)]


def documented_names(text: str) -> set[str]:
    return {re.sub(r"\(.*", "", name) for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*(?:\(i\))?)`", text)}


@pytest.mark.parametrize(
    "cls",
    [
        TokenizerContext,
        ExecutorContext,
        Batch,
        ExecutorOutput,
        SchedulerSnapshot,
        RequestView,
        SchedulingDecision,
        StructuredOutputContext,
        KVConnectorContext,
        ProposerContext,
        ProposalInput,
    ],
    ids=lambda cls: cls.__name__,
)
def test_every_field_handed_to_plugins_is_documented(cls):
    names = documented_names(paragraph(f"`{cls.__name__}`"))
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in names]
    assert not missing, f"{cls.__name__} fields missing from docs/hooks.md: {missing}"


@pytest.mark.parametrize("cls", [Batch, SchedulerSnapshot], ids=lambda cls: cls.__name__)
def test_helpers_are_documented(cls):
    names = documented_names(paragraph(f"`{cls.__name__}`"))
    public = [
        n for n, v in vars(cls).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))
    ]
    assert set(public) <= names, set(public) - names


@pytest.mark.parametrize("seam", SEAM_TABLE, ids=lambda seam: seam.hook)
def test_every_hook_and_its_traits_are_documented(seam):
    assert getattr(hookspecs, seam.hook).__doc__.strip()
    section = hook_section(seam.hook)
    for trait in seam.traits:
        assert f"`{trait.name}`" in section, f"trait {trait.name} of {seam.hook} is not documented"


def test_every_executor_capability_is_documented_with_the_executor_hook():
    names = documented_names(hook_section("register_executors"))
    missing = [f.name for f in dataclasses.fields(ExecutorCapabilities) if f.name not in names]
    assert not missing, f"ExecutorCapabilities fields missing from hooks.md (register_executors): {missing}"


def test_no_hook_is_documented_that_does_not_exist():
    documented = set(re.findall(r"^## `(register_\w+)\((?:register|commands)\)`", DOCS, flags=re.M))
    assert documented == {name for name in dir(hookspecs) if name.startswith("register_")}


def test_the_documented_executor_example_passes_the_executor_kit():
    source = re.search(r"```python\n(# hetero_executor_echo.py.*?)```", DOCS, flags=re.S).group(1)
    module = types.ModuleType("hetero_executor_echo")
    exec(compile(source, "docs/hooks.md", "exec"), module.__dict__)

    class TestEcho(ExecutorContract):
        def make_executor(self, ctx):
            return module.EchoExecutor(ctx)

    kit = TestEcho()
    for name in dir(kit):
        if name.startswith("test_"):
            getattr(kit, name)()
    kit.teardown_method(None)


@pytest.mark.parametrize(
    "cls",
    [TokenizerContext, StructuredOutputContext, KVConnectorContext, ProposerContext],
    ids=lambda cls: cls.__name__,
)
def test_seam_contexts_carry_the_fields_their_plugins_need_not_the_whole_settings(cls):
    # ExecutorContext still carries ``settings`` (issue 35 leaves it to the executor-capabilities change)
    assert "settings" not in {f.name for f in dataclasses.fields(cls)}
