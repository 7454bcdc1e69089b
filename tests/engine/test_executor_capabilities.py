"""An executor declares what it can do (``ExecutorCapabilities``) and core acts on the declaration:
a bad one is refused when the engine is built, in one line naming the executor; an executor written
before declarations existed still runs, with nothing optional and a DeprecationWarning."""

from __future__ import annotations

import textwrap

import pytest

import hetero_plugins_mock
from hetero_core.builder import build_engine
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.errors import InvalidRequestError, PluginError
from hetero_core.executor import ExecutorCapabilities
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.settings import load_settings
from tests.fake_distributions import FakeDistribution

EXECUTOR = """
from hetero_core.executor import ExecutorCapabilities
from hetero_plugins_mock.executor import MockExecutor

class Plain(MockExecutor):  # the mock's behaviour under {declaration}
    def __init__(self, ctx):
        super().__init__(ctx)
        {declaration}

@hookimpl
def register_executors(register):
    register("plain", Plain, needs_model=False)
"""


@pytest.fixture
def plain_engine(tmp_path, monkeypatch):
    """build(declaration, **settings): an engine on a mock subclass whose constructor runs ``declaration``."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def build(declaration: str, **settings):
        module = f"capabilities_plugin_{tmp_path.name}"
        source = textwrap.dedent(EXECUTOR).replace("{declaration}", declaration)
        (tmp_path / f"{module}.py").write_text("from hetero_core import hookimpl\n" + source)
        dist = FakeDistribution("hetero-x", "1.0", {"x": module})
        plugins = load_plugins(
            entry_points=list(dist.entry_points), extra_plugins=[("mock", hetero_plugins_mock)]
        )
        return build_engine(load_settings(executor="plain", **settings), plugins)

    return build


@pytest.mark.parametrize(
    "field, value, wanted",
    [
        ("block_swap", 1, "True or False"),
        ("vocab_size", 0, "an int >= 1 or None"),
        ("num_kv_blocks", True, "an int >= 1 or None"),
        ("kv_block_dim", -1, "an int >= 0"),
    ],
)
def test_a_declaration_has_typed_fields(field, value, wanted):
    with pytest.raises(TypeError, match=rf"^ExecutorCapabilities.{field} must be {wanted}, got {value!r}$"):
        ExecutorCapabilities(**{field: value})


def test_a_declaration_is_frozen_and_lists_its_methods():
    declared = ExecutorCapabilities(block_swap=True, kv_import=True)
    assert declared.declared_methods == ("swap_out", "swap_in", "import_blocks")
    with pytest.raises(AttributeError):
        declared.block_copy = True  # type: ignore[misc]


def test_a_declared_method_the_executor_lacks_is_refused_at_build(plain_engine):
    declaration = "self.swap_in = None; self.capabilities = ExecutorCapabilities(block_swap=True)"
    with pytest.raises(PluginError) as raised:
        plain_engine(declaration)
    assert str(raised.value) == (
        "executor 'plain' (Plain): it declares block_swap=True but has no callable "
        "swap_in; add the method(s) or leave the capability False (docs/hooks.md)"
    )


def test_a_declaration_of_the_wrong_type_is_refused_at_build(plain_engine):
    with pytest.raises(
        PluginError,
        match=r"^executor 'plain' \(Plain\): its capabilities is a dict, not "
        r"an ExecutorCapabilities \(hetero_core.executor\) "
        r"\(docs/hooks.md\)$",
    ):
        plain_engine("self.capabilities = {'block_swap': True}")


def test_the_engine_acts_on_the_declaration_not_on_the_methods(plain_engine):
    """The mock has every method; declaring none of them turns swap into recompute, and the prefix
    cache, speculation and prompt logprobs into what an executor without them gets."""
    engine = plain_engine("self.capabilities = ExecutorCapabilities()", preemption_mode="swap")
    try:
        assert engine.scheduler.preemptor.mode == "recompute" and engine.scheduler.can_copy_blocks is False
        assert engine.async_scheduling is False
        with pytest.raises(InvalidRequestError, match="it does not declare supports_prompt_logits"):
            engine.add_request("hi", SamplingParams(max_tokens=2, prompt_logprobs=0))
    finally:
        engine.shutdown()
    with pytest.raises(PluginError, match="capabilities do not declare supports_speculative_decoding=True"):
        plain_engine(
            "self.capabilities = ExecutorCapabilities()",
            num_speculative_tokens=2,
            speculative_proposer="ngram",
        )


def test_a_declared_kv_pool_sizes_the_allocator(plain_engine):
    engine = plain_engine("self.capabilities = ExecutorCapabilities(num_kv_blocks=12)", max_num_blocks=64)
    try:
        assert engine.scheduler.allocator.num_blocks == 12
    finally:
        engine.shutdown()


def test_an_executor_without_a_declaration_still_runs_with_nothing_optional(plain_engine):
    with pytest.warns(
        DeprecationWarning,
        match=r"executor 'plain' \(Plain\) declares no capabilities: "
        r"it runs with ExecutorCapabilities\(\)",
    ):
        engine = plain_engine("del self.capabilities", preemption_mode="swap")
    try:
        assert engine.executor.capabilities == ExecutorCapabilities()
        assert engine.scheduler.preemptor.mode == "recompute"
        assert engine.generate(["hello"], SamplingParams(max_tokens=3, ignore_eos=True))[0].error is None
    finally:
        engine.shutdown()
