"""The engine is explicit collaborators over one declared state: no class of engine/ mixes in
behaviour from two bases, every part is handed the same ``EngineState``, nothing adds state that
``EngineState`` does not declare, and what the engine's callers swap (the executor) reaches them all."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import hetero_core.engine
from hetero_core.engine.requests.params import SamplingParams


def engine_classes():
    for info in pkgutil.iter_modules(hetero_core.engine.__path__):
        module = importlib.import_module(f"hetero_core.engine.{info.name}")
        for cls in vars(module).values():
            if inspect.isclass(cls) and cls.__module__ == module.__name__:
                yield cls


def test_no_engine_class_has_more_than_one_base_for_behaviour():
    mixed = [
        f"{cls.__module__}.{cls.__qualname__}{cls.__bases__}"
        for cls in engine_classes()
        if len([base for base in cls.__bases__ if base is not object]) > 1
    ]
    assert mixed == []


@pytest.mark.parametrize(
    "settings",
    [{}, {"async_scheduling": True}, {"num_speculative_tokens": 2}],
    ids=["sync", "async", "speculative"],
)
def test_every_part_works_on_the_one_state_and_adds_nothing_to_it(make_mock_engine, settings):
    engine = make_mock_engine(**settings)
    state = engine.state
    parts = [engine.intake, engine.driver, engine.driver.sampler, engine.postprocessor]
    assert all(part.state is state for part in parts)
    outputs = engine.generate(
        ["abc abc abc", "xyz"], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    )
    assert [len(o.output_token_ids) for o in outputs] == [6, 6]
    assert engine.num_steps == state.timings.num_steps > 0
    assert state.seqs == {} and state.detokenizers == {} and state.num_queued_tokens == 0
    with pytest.raises(AttributeError):
        state.undeclared = 1  # the fields are slots: what the parts share is declared in state.py
    engine.shutdown()


def test_an_executor_set_on_the_engine_runs_every_step(make_mock_engine):
    engine = make_mock_engine()
    inner = engine.executor

    class Recording:
        batches = 0
        capabilities = inner.capabilities

        def execute(self, batch):
            Recording.batches += 1
            return inner.execute(batch)

        def shutdown(self):
            inner.shutdown()

    engine.executor = Recording()
    [out] = engine.generate("hello", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert not out.failed and len(out.output_token_ids) == 4
    assert engine.state.executor is engine.executor and Recording.batches == engine.num_steps
