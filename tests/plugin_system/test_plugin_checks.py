"""Plugins are checked when the engine is built: factory signatures, names and options at
registration; the methods of the objects factories return before the engine runs."""

from __future__ import annotations

import textwrap

import pytest

import hetero_plugins_mock
from hetero_core.builder import build_engine
from hetero_core.errors import PluginError
from hetero_core.plugin_system.checks import check_registration
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.settings import load_settings
from tests.fake_distributions import FakeDistribution


@pytest.fixture
def install(tmp_path, monkeypatch):
    """Write a plugin module and return a plugin set with it installed as distribution ``hetero-x``."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(source, name="x"):
        module = f"checked_plugin_{tmp_path.name}"  # a fresh module per test (sys.modules caches)
        (tmp_path / f"{module}.py").write_text("from hetero_core import hookimpl\n" + textwrap.dedent(source))
        dist = FakeDistribution(f"hetero-{name}", "1.0", {name: module})
        return load_plugins(
            entry_points=list(dist.entry_points), extra_plugins=[("mock", hetero_plugins_mock)]
        )

    return make


def build(plugin_set, **settings):
    return build_engine(load_settings(executor="mock", **settings), plugin_set)


def plugin_info(plugin_set, name="x"):
    return {p.name: p for p in plugin_set.plugins}[name]


def test_a_policy_without_decide_fails_at_build_naming_plugin_distribution_and_fix(install):
    plugins = install("""
    class OldStylePolicy:  # the retired priority(seq) API
        def priority(self, seq):
            return seq.seq_id

    @hookimpl
    def register_scheduler_policies(register):
        register("old", lambda options: OldStylePolicy())
    """)
    with pytest.raises(PluginError) as err:
        build(plugins, scheduler_policy="old")
    message = str(err.value)
    assert "scheduler policy 'old' (plugin 'x', distribution hetero-x 1.0)" in message
    assert "returned a OldStylePolicy without decide" in message
    assert (
        "decide(snapshot) -> SchedulingDecision (or subclass SortKeyPolicy and write key(request))" in message
    )


def test_a_factory_with_the_wrong_arity_fails_the_plugin_at_load_with_its_signature(install):
    plugins = install("""
    def make_policy():
        return None

    @hookimpl
    def register_scheduler_policies(register):
        register("noargs", make_policy)
    """)
    info = plugin_info(plugins)
    assert info.status == "failed"
    assert "core calls factory(options) but the factory has the signature make_policy()" in info.error
    with pytest.raises(
        PluginError, match=r"plugin 'x' \(hetero-x 1.0\) failed to load: .*signature make_policy\(\)"
    ):
        build(plugins, scheduler_policy="noargs")


def test_an_allocator_factory_must_take_three_arguments(install):
    plugins = install("""
    @hookimpl
    def register_kv_allocators(register):
        register("two", lambda num_blocks, block_size: None)
    """)
    assert "core calls factory(num_blocks, block_size, options)" in plugin_info(plugins).error


def test_classes_and_defaulted_parameters_are_fine_factories():
    class Policy:
        def __init__(self, options, extra=None):
            pass

    check_registration("scheduler_policy", "cls", Policy, None)
    check_registration("executor", "varargs", lambda *args: None, None)
    check_registration("kv_allocator", "kw", lambda n, b, options=None: None, None)


@pytest.mark.parametrize(
    "name, factory, options, message",
    [
        ("my executor", lambda ctx: None, None, "name 'my executor' is not usable in settings"),
        ("", lambda ctx: None, None, "name '' is not usable"),
        (None, lambda ctx: None, None, "name None is not usable"),
        ("ok", "not callable", None, "the factory must be callable as factory(ctx), got str"),
        ("ok", lambda ctx: None, dict, "options must be a pydantic BaseModel subclass"),
    ],
)
def test_bad_registrations_are_refused(name, factory, options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_registration("executor", name, factory, options)


def test_an_executor_without_shutdown_fails_at_build(install):
    plugins = install("""
    class Half:
        def execute(self, batch):
            return None

    @hookimpl
    def register_executors(register):
        register("half", lambda ctx: Half(), needs_model=False)
    """)
    with pytest.raises(
        PluginError,
        match=r"executor 'half' \(plugin 'x', distribution hetero-x 1.0\): "
        r"its factory returned a Half without shutdown",
    ):
        build_engine(load_settings(executor="half"), plugins)


def test_an_allocator_missing_methods_fails_at_build(install):
    plugins = install("""
    class Tiny:
        num_blocks = block_size = num_free_blocks = num_used_blocks = 1

        def grow(self, table, n):
            pass

    @hookimpl
    def register_kv_allocators(register):
        register("tiny", lambda n, b, o: Tiny())
    """)
    with pytest.raises(
        PluginError,
        match="returned a Tiny without num_blocks_for, get_computed_blocks, allocate_slots, "
        "cache_blocks, free, has_prefix_cache, has_copy_on_write, num_cached_blocks; .*KVAllocator",
    ):
        build(plugins, kv_allocator="tiny")


def test_a_tokenizer_with_a_bad_vocab_size_fails_at_build(install):
    plugins = install("""
    class Tok:
        eos_token_id = None
        vocab_size = "many"

        def encode(self, text):
            return [1]

        def decode(self, ids):
            return ""

        def encode_chat(self, messages):
            return [1]

    @hookimpl
    def register_tokenizers(register):
        register("tok", lambda ctx: Tok())
    """)
    with pytest.raises(PluginError, match="tokenizer 'tok' .*vocab_size is 'many' \\(needs an int >= 1\\)"):
        build(plugins, tokenizer="tok")


def test_core_and_mock_components_pass_the_checks(make_mock_engine):
    assert make_mock_engine().generate(["hi"], {"max_tokens": 2, "temperature": 0})[0].error is None
