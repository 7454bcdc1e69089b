"""docs/hooks.md's KV-allocator example is real: it imports only hetero_core.kv, passes the kit, and an
engine runs on it with the same tokens as the built-in paged allocator."""

import re
import types
from pathlib import Path

import hetero_plugins_mock
from hetero_core.builder import build_engine
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.settings import load_settings
from hetero_core.testing.kv_allocator_contract import KVAllocatorContract

DOCS = (Path(__file__).parents[2] / "docs" / "hooks.md").read_text(encoding="utf-8")
SECTION = DOCS.split("## `register_kv_allocators(register)`", 1)[1].split("\n## ", 1)[0]
EXAMPLE = re.search(r"```python\n(.*?)```", SECTION, re.S).group(1)


def example_module() -> types.ModuleType:
    module = types.ModuleType("hetero_kv_free_list")
    exec(compile(EXAMPLE, "docs/hooks.md", "exec"), module.__dict__)
    return module


def test_the_example_imports_only_the_kv_facade_and_the_hook_marker():
    imports = re.findall(r"^(?:from|import) (\S+) import (.+)$", EXAMPLE, re.M)
    assert imports[0] == ("hetero_core", "hookimpl") and {m for m, _ in imports[1:]} == {"hetero_core.kv"}


def test_the_section_names_every_member_of_the_protocol():
    from hetero_core.testing.kv_allocator_contract import ATTRIBUTES, MEMBERS

    missing = [name for name in MEMBERS + ATTRIBUTES if f"`{name}" not in SECTION]
    assert not missing, f"docs/hooks.md's allocator section does not name {missing}"


class TestTheDocsExample(KVAllocatorContract):
    def make_allocator(self, num_blocks, block_size):
        return example_module().FreeListAllocator(num_blocks, block_size)


def test_an_engine_runs_on_the_example_with_the_same_tokens():
    plugins = load_plugins(
        entry_points=[], extra_plugins=[("mock", hetero_plugins_mock), ("free-list", example_module())]
    )
    common = dict(
        executor="mock", block_size=4, max_num_blocks=24, memory_threshold=1.0, enable_prefix_caching=False
    )
    prompts = [f"request {i} " * (1 + i % 4) for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine = build_engine(load_settings(kv_allocator="free-list", **common), plugins)
    outputs = engine.generate(prompts, params)
    reference = build_engine(load_settings(**common), plugins).generate(prompts, params)
    assert [o.output_token_ids for o in outputs] == [o.output_token_ids for o in reference]
    assert engine.stats().num_preemptions > 0 and engine.stats().num_free_blocks == 24
