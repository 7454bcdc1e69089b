"""One facade per seam: what a plugin author imports is one light module with a pinned ``__all__``,
and it is what the docs import."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hetero_core
from hetero_core.plugin_system.hookspecs import hookimpl

FACADES = {
    "hetero_core.executor": ["Batch", "Executor", "ExecutorCapabilities", "ExecutorContext", "ExecutorOutput",
                             "slot_of"],
    "hetero_core.policy": ["MAX_STEPS_HELD_BACK", "RequestView", "SchedulerPolicy", "SchedulerSnapshot",
                           "SchedulingDecision", "SortKeyPolicy", "decision_problems"],
    "hetero_core.tokenizer": ["Tokenizer", "TokenizerContext"],
    "hetero_core.kv": ["NO_BLOCK_COPIES", "NO_COMPUTED_BLOCKS", "BlockAllocatorError", "ComputedBlocks",
                       "ContiguousBlockAllocator", "KVAllocator", "NoPrefixCache", "PagedBlockAllocator",
                       "SlotAllocation"],
    "hetero_core.structured_output": ["GrammarState", "GuidedDecodingParams", "StructuredOutputBackend",
                                      "StructuredOutputContext", "allocate_token_bitmask",
                                      "allowed_token_ids", "num_words"],
    "hetero_core.kv_transfer": ["KVBlocks", "KVConnector", "KVConnectorContext", "KVHandoff", "KVTensor",
                                "KVTransferError", "kv_tensor_from_torch", "kv_tensor_to_torch"],
    "hetero_core.architectures": ["ArchitectureRegistry", "CausalLM", "KVLayerSpec", "ModelArchitecture",
                                  "ModelConfig", "WeightMapping", "installed_architectures",
                                  "kv_bytes_per_token", "parse_config", "rope_settings", "same_kv_layout",
                                  "unused_buffers",
                                  # the building blocks an architecture reuses (loaded on first use: torch)
                                  "AttentionBackend", "KVCache", "RMSNorm", "SwiGLU", "RotaryEmbedding",
                                  "apply_rotary", "rope_inv_freq", "LlamaAttention", "LlamaDecoderLayer",
                                  "LlamaModel", "LlamaForCausalLM"],
    "hetero_core.speculative": ["ProposalInput", "Proposer", "ProposerContext"],
    "hetero_core.testing": ["ExecutorContract", "ArchitectureContract", "SchedulerPolicyContract",
                            "KVAllocatorContract", "StructuredOutputContract", "KVConnectorContract",
                            "ProposerContract", "TokenizerContract", "ContractFailure", "BlockPool",
                            "ContractSequence", "build_batch"],
}  # fmt: skip
DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("module", FACADES)
def test_each_facade_pins_its_public_names(module):
    facade = importlib.import_module(module)
    assert facade.__all__ == FACADES[module]
    for name in facade.__all__:
        assert getattr(facade, name) is not None


@pytest.mark.parametrize("module", [m for m in FACADES if m != "hetero_core.testing"])
def test_there_is_one_hook_marker_and_the_facades_keep_it_for_old_imports(module):
    # the way is ``from hetero_core import hookimpl``; ``from hetero_core.policy import hookimpl`` was
    # documented before issue 35 and still gives the same object
    assert importlib.import_module(module).hookimpl is hookimpl is hetero_core.hookimpl


def test_facades_import_light():
    code = (
        "import sys, hetero_core.executor, hetero_core.policy, hetero_core.tokenizer, hetero_core.kv, "
        "hetero_core.structured_output, hetero_core.kv_transfer, hetero_core.speculative, "
        "hetero_core.testing, hetero_core.architectures; "
        "print(sorted(m for m in ('torch', 'pytest', 'hypothesis', 'pydantic_settings', "
        "'hetero_core.builder',"
        " 'hetero_core.engine.engine') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "[]", result.stderr


def documented_imports() -> list[tuple[str, str, str]]:
    """(page, module, name) for every ``from hetero_core... import name`` in the docs' Python blocks."""
    found = []
    for page in sorted(DOCS.glob("*.md")):
        for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
            try:
                tree = ast.parse(block)
            except SyntaxError:  # a fragment (an elided body): its import lines still count
                tree = ast.parse("\n".join(line for line in block.splitlines() if line.startswith("from ")))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hetero_core":
                    found += [(page.name, node.module, alias.name) for alias in node.names]
    return found


def test_the_docs_import_plugin_names_from_facades():
    imports = documented_imports()
    seam_modules = set(FACADES) | {"hetero_core"}
    plugin_pages = {"hooks.md", "scheduling.md"}
    assert {m for page, m, _ in imports if page in plugin_pages} <= seam_modules
    for page, module, name in imports:
        if module in seam_modules:
            assert name in importlib.import_module(module).__all__, (
                f"docs/{page}: {name} is not in {module}.__all__"
            )
    assert {(m, n) for _, m, n in imports} >= {
        ("hetero_core.executor", "ExecutorContext"),
        ("hetero_core.policy", "SortKeyPolicy"),
        ("hetero_core", "hookimpl"),
    }
    assert not [(page, m) for page, m, n in imports if n == "hookimpl" and m != "hetero_core"]


def test_the_root_names_the_facade_for_a_seam_name_it_does_not_export():
    for name, module in hetero_core._FACADE_NAMES.items():
        assert name in FACADES[module], (name, module)
        with pytest.raises(AttributeError, match=f"has no attribute '{name}'; import it from {module}$"):
            getattr(hetero_core, name)
