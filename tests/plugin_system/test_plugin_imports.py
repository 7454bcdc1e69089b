"""Our own plugins (mock, triton, cuda and the packages in plugins/) import from hetero_core only what
an outside plugin may: the root's public names, one facade per seam, the kits, the logger and the
model API (``hetero_core.model.*``, which executors that run a real model build on). Every import
counts, including those inside functions. See docs/hooks.md ("What a plugin imports").

The packages in plugins/ are written as an outside author would, so they are held to less: the root
and the facades (``tests/plugin_system/test_facades.py``'s ``FACADES``), no ``hetero_core.model.*``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.plugin_system.test_facades import FACADES

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_SOURCES = sorted(
    path
    for folder in ("hetero_plugins_mock", "hetero_plugins_triton", "hetero_plugins_cuda", "plugins")
    for path in (ROOT / folder).rglob("*.py")
)
PUBLIC_MODULES = {
    "hetero_core",  # its __all__ (errors, SamplingParams, hookimpl, ...)
    "hetero_core.executor",
    "hetero_core.policy",
    "hetero_core.kv",
    "hetero_core.tokenizer",  # one facade per seam
    "hetero_core.structured_output",
    "hetero_core.kv_transfer",
    "hetero_core.speculative",
    "hetero_core.architectures",  # model architectures (register_model_architectures)
    "hetero_core.testing",  # the contract kits
    "hetero_core.logging",  # get_logger
}
PUBLIC_PACKAGES = ("hetero_core.model.",)  # the model API for executors that run a real model
# Imports another part of issue 24 removes (the triton executor stops subclassing the torch executor);
# delete the entry with it.
KNOWN: dict[str, set[str]] = {}  # plugin file -> private modules it may still import (none)


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return modules


AUTHOR_MODULES = {"hetero_core", *FACADES}  # what an outside plugin (plugins/) imports from hetero_core


def private_imports(path: Path) -> set[str]:
    core = {m for m in imported_modules(path) if m.split(".")[0] == "hetero_core"}
    return {m for m in core if m not in PUBLIC_MODULES and not m.startswith(PUBLIC_PACKAGES)}


def non_author_imports(path: Path) -> set[str]:
    return {m for m in imported_modules(path) if m.split(".")[0] == "hetero_core" and m not in AUTHOR_MODULES}


@pytest.mark.parametrize("source", PLUGIN_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_plugins_import_only_public_hetero_core_modules(source):
    private = private_imports(source) - KNOWN.get(str(source.relative_to(ROOT)), set())
    assert not private, (
        f"{source.relative_to(ROOT)} imports {sorted(private)}; plugins import from "
        f"{sorted(PUBLIC_MODULES)} or hetero_core.model.*"
    )


def test_the_check_sees_every_plugin_and_would_catch_a_private_import(tmp_path):
    assert {p.relative_to(ROOT).parts[0] for p in PLUGIN_SOURCES} == {
        "hetero_plugins_mock",
        "hetero_plugins_triton",
        "hetero_plugins_cuda",
        "plugins",
    }
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from hetero_core.executor import Batch\nimport hetero_core.model.config\n"
        "def f():\n    from hetero_core.engine.scheduling.batch import slot_of\n"
        "    import hetero_core.plugin_system.hookspecs\n"
    )
    assert private_imports(bad) == {
        "hetero_core.engine.scheduling.batch",
        "hetero_core.plugin_system.hookspecs",
    }


OUTSIDE_SOURCES = [path for path in PLUGIN_SOURCES if path.relative_to(ROOT).parts[0] == "plugins"]


@pytest.mark.parametrize("source", OUTSIDE_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_outside_plugins_import_only_the_root_and_the_facades(source):
    extra = non_author_imports(source)
    assert not extra, (
        f"{source.relative_to(ROOT)} imports {sorted(extra)}; a plugin in plugins/ imports only "
        f"from {sorted(AUTHOR_MODULES)} (hetero_core.architectures exports the architecture building blocks)"
    )


def test_the_outside_check_sees_the_phi3_model_and_would_catch_the_model_api(tmp_path):
    assert any(p.name == "model.py" and "hetero-model-phi3" in p.parts for p in OUTSIDE_SOURCES)
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from hetero_core import hookimpl\nfrom hetero_core.architectures import LlamaAttention\n"
        "def f():\n    from hetero_core.model.llama import LlamaForCausalLM\n"
    )
    assert non_author_imports(bad) == {"hetero_core.model.llama"}
