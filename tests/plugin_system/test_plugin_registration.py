"""Registration catches typos: a misspelt hook name, an unknown or mistyped trait, and a selected
name nobody registers each fail in one line that names the plugin and the closest choice, and a
broken plugin never blocks the others."""

from __future__ import annotations

import textwrap

import pytest

from hetero_core.errors import PluginError, UnknownComponentError
from hetero_core.plugin_system.checks import check_registration
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.plugin_system.seams import SEAM_TABLE
from tests.fake_distributions import FakeDistribution

GOOD = """
from hetero_core.policy import SortKeyPolicy, hookimpl

class ReversePolicy(SortKeyPolicy):
    def key(self, request):
        return -request.arrival_order

@hookimpl
def register_scheduler_policies(register):
    register("reverse", lambda options: ReversePolicy())
"""


@pytest.fixture
def install(tmp_path, monkeypatch):
    """Install plugin modules as fake distributions (``name -> source``) next to a good one; returns
    the plugin set and its infos by name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(**sources):
        dists = [FakeDistribution("hetero-policy-reverse", "1.0", {"reverse": f"good_{tmp_path.name}"})]
        (tmp_path / f"good_{tmp_path.name}.py").write_text(GOOD)
        for name, source in sources.items():
            module = f"{name}_{tmp_path.name}"  # fresh per test: sys.modules caches
            (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
            dists.append(FakeDistribution(f"hetero-{name}", "0.3", {name: module}))
        plugin_set = load_plugins(entry_points=[ep for d in dists for ep in d.entry_points])
        return plugin_set, {p.name: p for p in plugin_set.plugins}

    return make


def test_a_misspelt_hook_fails_its_plugin_in_one_line_naming_the_closest_hook(install):
    plugin_set, info = install(
        typo="""
        from hetero_core.policy import SortKeyPolicy, hookimpl

        @hookimpl
        def register_scheduler_policy(register):  # the hook is register_scheduler_policies
            register("typo", lambda options: SortKeyPolicy())
        """
    )
    assert info["typo"].status == "failed" and info["typo"].components == {}
    assert info["typo"].error == (
        "implements register_scheduler_policy, which is not a hetero hook; did you mean "
        "'register_scheduler_policies'? (hooks: register_commands, register_executors, "
        "register_kv_allocators, "
        "register_kv_connectors, register_model_architectures, register_scheduler_policies, "
        "register_speculative_proposers, "
        "register_structured_output_backends, register_tokenizers)"
    )
    assert info["reverse"].status == "loaded"  # the others keep working
    with pytest.raises(
        PluginError,
        match=r"plugin 'typo' \(hetero-typo 0.3\) failed to load: implements "
        r"register_scheduler_policy, which is not a hetero hook",
    ):
        plugin_set.registry.get("scheduler_policy", "typo")


def test_a_misspelt_hook_beside_a_good_one_registers_nothing(install):
    plugin_set, info = install(
        half="""
        from hetero_core.executor import hookimpl

        @hookimpl
        def register_tokenizers(register):
            register("half-tok", lambda ctx: None)

        @hookimpl
        def register_executor(register):
            pass
        """
    )
    assert info["half"].status == "failed" and "did you mean 'register_executors'?" in info["half"].error
    assert "half-tok" not in plugin_set.registry.names("tokenizer")


@pytest.mark.parametrize(
    "registration, error",
    [
        (
            '"gpu", lambda ctx: None, needs_modle=True',
            "executor 'gpu': unknown trait 'needs_modle'; did you mean 'needs_model'? "
            "(traits: needs_model, preflight, tensor_parallel, pipeline_parallel)",
        ),
        (
            '"gpu", lambda ctx: None, needs_model="yes"',
            "executor 'gpu': trait needs_model='yes' must be True or False",
        ),
        (
            '"gpu", lambda ctx: None, preflight=["cuda"]',
            "executor 'gpu': trait preflight=['cuda'] must be a callable",
        ),
        (
            '"gpu", lambda ctx: None, sharded=True',
            "executor 'gpu': unknown trait 'sharded' (traits: needs_model,",
        ),
    ],
)
def test_an_unknown_or_mistyped_trait_fails_its_plugin(install, registration, error):
    plugin_set, info = install(
        traits=f"""
        from hetero_core.executor import hookimpl

        @hookimpl
        def register_executors(register):
            register({registration})
        """
    )
    assert info["traits"].status == "failed"
    assert info["traits"].error.startswith(f"register_executors raised ValueError: {error}")
    assert info["reverse"].status == "loaded"


def test_a_seam_without_traits_refuses_any():
    with pytest.raises(
        ValueError,
        match="scheduler_policy 'p': unknown trait 'needs_model'; a scheduler "
        r"policy takes no traits \(remove it\)",
    ):
        check_registration("scheduler_policy", "p", lambda options: None, None, {"needs_model": False})


def test_every_trait_core_and_the_plugins_register_is_declared():
    plugin_set = load_plugins()
    for seam in SEAM_TABLE:
        for name in plugin_set.registry.names(seam.name):
            component = plugin_set.registry.get(seam.name, name)
            assert all(seam.trait(t) for t in component.traits), (seam.name, name, component.traits)
    assert plugin_set.registry.failures == []


def test_an_unknown_name_names_the_plugins_that_registered_nothing(install):
    plugin_set, info = install(
        empty="VERSION = 1\n",
        shy="""
        from hetero_core.executor import hookimpl

        @hookimpl
        def register_executors(register):
            pass  # e.g. registers only when a GPU is present
        """,
    )
    assert info["empty"].status == info["shy"].status == "loaded"
    with pytest.raises(UnknownComponentError) as err:
        plugin_set.registry.get("executor", "gpu")
    assert str(err.value) == (
        "unknown executor 'gpu'; available: torch; loaded without registering anything: plugin 'empty' "
        "(hetero-empty 0.3) implements no hetero hook; plugin 'shy' (hetero-shy 0.3) ran register_executors "
        "without calling register()"
    )
    plugin_set.registry.get("scheduler_policy", "reverse")  # a registered name is unaffected


def test_hetero_plugins_shows_a_registration_failure(install, monkeypatch, capsys):
    from hetero_core.cli.main import main
    from hetero_core.plugin_system import discovery

    dist = FakeDistribution("hetero-typo", "0.3", {"typo": "typo_module"})
    monkeypatch.setattr(discovery, "_discover", lambda: list(dist.entry_points))
    monkeypatch.setitem(__import__("sys").modules, "typo_module", _module_with_hook("register_executor"))
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert (
        "typo (hetero-typo 0.3): failed\n    error: implements register_executor, "
        "which is not a hetero hook; "
        "did you mean 'register_executors'?" in out
    )


def _module_with_hook(name: str):
    import types

    from hetero_core.executor import hookimpl

    module = types.ModuleType("typo_module")
    setattr(module, name, hookimpl(lambda register: None))
    return module
