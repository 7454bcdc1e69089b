"""Plugin discovery: real installed entry points and fake distributions."""

import textwrap

import pytest

from hetero_core.errors import PluginError, UnknownComponentError
from hetero_core.plugin_system import hookspecs
from hetero_core.plugin_system.discovery import AUTOLOAD_ENV, load_plugins
from tests.fake_distributions import FakeDistribution


@pytest.fixture
def plugin_modules(tmp_path, monkeypatch):
    """Write plugin modules to a temp dir on sys.path; returns a writer."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name, source):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))

    return write


def fake_entry_points(*dists):
    return [ep for dist in dists for ep in dist.entry_points]


GOOD = """
from hetero_core.policy import SortKeyPolicy, hookimpl

class ReversePolicy(SortKeyPolicy):
    def key(self, request):
        return -request.arrival_order

@hookimpl
def register_scheduler_policies(register):
    register("reverse", lambda options: ReversePolicy())
"""


def test_installed_plugins_are_discovered_through_entry_points():
    plugin_set = load_plugins()
    by_name = {p.name: p for p in plugin_set.plugins}
    assert by_name["core"].components == {
        "tokenizer": ["byte", "hf"],
        "scheduler_policy": ["fcfs", "priority"],
        "kv_allocator": ["paged", "contiguous"],
        "executor": ["torch"],
        "structured_output": ["xgrammar"],
        "kv_connector": ["socket"],
        "speculative_proposer": ["ngram", "draft"],
        "architecture": [
            "LlamaForCausalLM",
            "Qwen2ForCausalLM",
            "Qwen3ForCausalLM",
            "Qwen3MoeForCausalLM",
            "Qwen2MoeForCausalLM",
            "MixtralForCausalLM",
            "DeepseekV2ForCausalLM",
            "DeepseekV3ForCausalLM",
        ],
    }
    for name in ("mock", "cuda", "triton"):
        assert by_name[name].distribution == f"hetero-plugins-{name}"
        assert by_name[name].version == "0.1.0"
        assert by_name[name].components == {"executor": [name] if name != "mock" else ["mock", "null"]}
    assert plugin_set.registry.names("executor") == ["cuda", "mock", "null", "torch", "triton"]


def test_autoload_can_be_switched_off(monkeypatch):
    monkeypatch.setenv(AUTOLOAD_ENV, "1")
    assert [p.name for p in load_plugins().plugins] == ["core"]


def test_fake_distribution_plugin_registers_and_is_selectable(plugin_modules):
    plugin_modules("good_plugin", GOOD)
    dist = FakeDistribution("hetero-policy-reverse", "1.2.3", {"reverse": "good_plugin"})
    plugin_set = load_plugins(entry_points=fake_entry_points(dist))
    info = {p.name: p for p in plugin_set.plugins}["reverse"]
    assert (info.distribution, info.version, info.status) == ("hetero-policy-reverse", "1.2.3", "loaded")
    assert plugin_set.registry.get("scheduler_policy", "reverse").plugin == "reverse"


def test_third_party_policy_drives_the_engine(plugin_modules, recording):
    import hetero_plugins_mock
    from hetero_core.builder import build_engine
    from hetero_core.engine.requests.params import SamplingParams
    from hetero_core.settings import load_settings

    plugin_modules("good_plugin", GOOD)
    dist = FakeDistribution("hetero-policy-reverse", "1.0", {"reverse": "good_plugin"})
    plugin_set = load_plugins(
        entry_points=fake_entry_points(dist), extra_plugins=[("mock", hetero_plugins_mock)]
    )
    engine = build_engine(
        load_settings(executor="mock", scheduler_policy="reverse", max_batch_size=1), plugin_set
    )
    rec = recording(engine)
    engine.generate(["first", "second", "third"], SamplingParams(max_tokens=2))
    assert rec.batches[0].seq_ids == [2]  # newest first


def test_broken_plugin_is_recorded_and_does_not_block_others(plugin_modules):
    plugin_modules("good_plugin", GOOD)
    plugin_modules("broken_plugin", "import a_module_that_does_not_exist\n")
    good = FakeDistribution("hetero-policy-reverse", "1.0", {"reverse": "good_plugin"})
    broken = FakeDistribution("hetero-plugins-broken", "0.9", {"broken": "broken_plugin"})
    plugin_set = load_plugins(entry_points=fake_entry_points(good, broken))
    info = {p.name: p for p in plugin_set.plugins}
    assert info["broken"].status == "failed" and "a_module_that_does_not_exist" in info["broken"].error
    assert info["reverse"].status == "loaded"
    with pytest.raises(
        PluginError,
        match=r"plugin 'broken' \(hetero-plugins-broken 0.9\) failed to load: "
        r"ModuleNotFoundError",
    ):
        plugin_set.registry.get("executor", "broken")


def test_duplicate_names_fail_loudly_naming_both_owners(plugin_modules):
    source = """
    from hetero_core.executor import hookimpl
    @hookimpl
    def register_executors(register):
        register("twin", lambda ctx: None)
    """
    plugin_modules("twin_a", source)
    plugin_modules("twin_b", source)
    plugin_set = load_plugins(
        entry_points=fake_entry_points(
            FakeDistribution("pkg-a", "1", {"alpha": "twin_a"}),
            FakeDistribution("pkg-b", "1", {"beta": "twin_b"}),
        )
    )
    with pytest.raises(PluginError, match="registered by more than one plugin: 'alpha' and 'beta'"):
        plugin_set.registry.get("executor", "twin")
    assert plugin_set.registry.get("executor", "torch").plugin == "core"  # the rest still work


def test_allow_list_restricts_which_installed_plugins_load(plugin_modules):
    plugin_modules("good_plugin", GOOD)
    dist = FakeDistribution("hetero-policy-reverse", "1.0", {"reverse": "good_plugin"})
    plugin_set = load_plugins(allow=[], entry_points=fake_entry_points(dist))
    info = {p.name: p for p in plugin_set.plugins}
    assert info["reverse"].status == "not allowed" and info["core"].status == "loaded"
    with pytest.raises(
        UnknownComponentError, match="unknown scheduler policy 'reverse'; available: fcfs, priority"
    ):
        plugin_set.registry.get("scheduler_policy", "reverse")


def test_hook_with_a_wrong_signature_is_rejected_with_the_signature(plugin_modules):
    plugin_modules(
        "bad_sig",
        """
    from hetero_core.executor import hookimpl
    @hookimpl
    def register_executors(register, extra_argument):
        pass
    """,
    )
    plugin_set = load_plugins(
        entry_points=fake_entry_points(FakeDistribution("pkg", "1", {"badsig": "bad_sig"}))
    )
    info = {p.name: p for p in plugin_set.plugins}["badsig"]
    assert info.status == "failed" and "extra_argument" in info.error


def test_a_hook_that_raises_registers_nothing(plugin_modules):
    plugin_modules(
        "half",
        """
    from hetero_core.executor import hookimpl
    @hookimpl
    def register_tokenizers(register):
        register("half-tok", lambda ctx: None)
    @hookimpl
    def register_executors(register):
        raise RuntimeError("no GPU today")
    """,
    )
    plugin_set = load_plugins(entry_points=fake_entry_points(FakeDistribution("pkg", "1", {"half": "half"})))
    assert "half-tok" not in plugin_set.registry.names("tokenizer")
    info = {p.name: p for p in plugin_set.plugins}["half"]
    assert "register_executors raised RuntimeError: no GPU today" in info.error


def test_unknown_component_lists_the_available_names():
    plugin_set = load_plugins()
    with pytest.raises(
        UnknownComponentError, match="unknown executor 'cdua'; available: cuda, mock, null, torch, triton"
    ):
        plugin_set.registry.get("executor", "cdua")


def test_every_hook_is_documented_and_registered_by_core():
    specs = [name for name in dir(hookspecs) if name.startswith("register_")]
    assert len(specs) == 9
    docs = open(
        __file__.replace("tests/plugin_system/test_plugins.py", "docs/hooks.md"), encoding="utf-8"
    ).read()
    for name in specs:
        assert getattr(hookspecs, name).__doc__.strip()
        argument = "commands" if name == "register_commands" else "register"
        assert f"`{name}({argument})`" in docs
    core = {p.name: p for p in load_plugins(entry_points=[]).plugins}["core"]
    assert (
        len(core.components) == 8
    )  # core uses every seam hook and register_model_architectures itself (its commands are built in; see
    # tests/plugin_system/test_plugin_commands.py for register_commands)
