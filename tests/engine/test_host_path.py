"""Less work per step, same behaviour: outputs only for requests someone reads, sort keys asked once
when they read only fields that never change, the null executor through every engine path, and
the async_scheduling setting chosen by the executor unless set."""

from __future__ import annotations

import pytest

from hetero_core.engine.requests.params import SamplingParams
from hetero_core.engine.scheduling.policy import SortKeyPolicy


def greedy(max_tokens=5, **extra):
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **extra)


def test_a_request_added_without_streaming_gets_only_its_final_output(make_mock_engine):
    engine = make_mock_engine()
    quiet = engine.add_request("quiet one", greedy(), stream=False)
    loud = engine.add_request("loud one", greedy())
    seen = {quiet: [], loud: []}
    while engine.has_unfinished_requests():
        for out in engine.step():
            seen[out.request_id].append(out)
    assert [o.finished for o in seen[quiet]] == [True] and len(seen[quiet][0].output_token_ids) == 5
    assert len(seen[loud]) == 5 and seen[loud][-1].finished
    assert seen[quiet][0].text and seen[quiet][0].text == engine.tokenizer.decode(
        seen[quiet][0].output_token_ids
    )


class CountingKey(SortKeyPolicy):
    name = "counting"

    def __init__(self, field="arrival_order", cache_keys=True):
        self.field, self.cache_keys, self.calls = field, cache_keys, 0

    def key(self, request):
        self.calls += 1
        return getattr(request, self.field)


@pytest.mark.parametrize(
    "field, cache_keys, asked_every_step",
    [
        ("arrival_order", True, False),  # never changes: asked once per request
        ("priority", True, False),
        ("num_output_tokens", True, True),  # changes every step: asked every step
        ("arrival_order", False, True),  # the policy opted out (its key reads something else)
    ],
)
def test_a_sort_key_is_asked_again_only_when_it_may_change(
    make_mock_engine, field, cache_keys, asked_every_step
):
    engine = make_mock_engine()
    policy = engine.scheduler.runner.policy = CountingKey(field, cache_keys)
    ids = [engine.add_request(f"prompt {i}", greedy(max_tokens=6)) for i in range(3)]
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id] = out
    assert all(len(outputs[i].output_token_ids) == 6 for i in ids)
    if asked_every_step:
        assert policy.calls >= 3 * 6
    else:
        assert policy.calls == 3


def test_a_sort_key_orders_as_the_snapshot_path_does(make_mock_engine):
    """Latest-first by priority, on a pool that fits one request at a time: the key decides who runs."""

    class ByPriority(SortKeyPolicy):
        name = "by-priority"

        def key(self, request):
            return -request.priority

    class ByPriorityWithSnapshots(ByPriority):
        def decide(self, snapshot):  # overridden: the runner builds snapshots as before
            return super().decide(snapshot)

    order = {}
    for policy in (ByPriority(), ByPriorityWithSnapshots()):
        engine = make_mock_engine(max_batch_size=1, max_num_seqs=1)
        engine.scheduler.runner.policy = policy
        ids = [
            engine.add_request(f"p{i}", greedy(max_tokens=2), priority=p) for i, p in enumerate([1, 5, 3, 5])
        ]
        finished = []
        while engine.has_unfinished_requests():
            finished += [ids.index(o.request_id) for o in engine.step() if o.finished]
        order[type(policy).__name__] = finished
    assert order["ByPriority"] == order["ByPriorityWithSnapshots"] == [1, 3, 2, 0]


def null_engine(make_mock_engine, **settings):
    import hetero_plugins_mock
    from hetero_core.builder import build_engine
    from hetero_core.plugin_system.discovery import load_plugins
    from hetero_core.settings import load_settings

    executor = {"name": "null", "null": settings.pop("null", {})}
    plugins = load_plugins(entry_points=[], extra_plugins=[("mock", hetero_plugins_mock)])
    return build_engine(load_settings(executor=executor, **settings), plugins)


@pytest.mark.parametrize(
    "settings",
    [
        dict(),
        dict(
            max_num_blocks=24, block_size=4, memory_threshold=1.0, preemption_mode="swap", num_swap_blocks=64
        ),
        dict(max_num_blocks=24, block_size=4, memory_threshold=1.0, max_prefill_chunk=3),
        dict(async_scheduling=True),
    ],
)
def test_the_null_executor_runs_every_engine_path_with_the_same_tokens(make_mock_engine, settings):
    prompts = ["shared prefix " * 3 + str(i) for i in range(6)]
    params = [greedy(8), greedy(8, stop=["A"]), greedy(3)] * 2
    reference = [o.output_token_ids for o in null_engine(make_mock_engine).generate(prompts, params)]
    engine = null_engine(make_mock_engine, **settings)
    outputs = engine.generate(prompts, params)
    assert [o.output_token_ids for o in outputs] == reference and not any(o.error for o in outputs)
    allocator = engine.scheduler.allocator
    assert allocator.num_free_blocks == allocator.num_blocks
    engine.shutdown()


@pytest.mark.parametrize(
    "step_time, setting, expected",
    [
        (0.0, None, False),  # the null executor without device time prefers the plain loop
        (0.001, None, True),  # with device time to overlap, async scheduling
        (0.001, False, False),  # the setting wins
        (0.0, True, True),
    ],
)
def test_async_scheduling_is_the_executors_preference_unless_set(
    make_mock_engine, step_time, setting, expected
):
    extra = {} if setting is None else {"async_scheduling": setting}
    engine = null_engine(make_mock_engine, null={"step_time": step_time}, **extra)
    assert engine.async_scheduling is expected
    [out] = engine.generate(["x"], greedy(2))
    assert len(out.output_token_ids) == 2
    assert (engine.driver.executor_thread is not None) is expected
    engine.shutdown()


def test_the_mock_executor_keeps_the_plain_loop_by_default(make_mock_engine):
    assert make_mock_engine().async_scheduling is False


def test_a_step_interrupted_inside_the_executor_is_redone_by_the_next(make_mock_engine):
    engine = make_mock_engine(max_prefill_chunk=4)
    reference = engine.generate(["interrupt me", "and me"], greedy(6))
    inner, calls = engine.executor, []

    class InterruptsThird:
        def execute(self, batch):
            calls.append(batch)
            if len(calls) == 3:
                raise KeyboardInterrupt
            return inner.execute(batch)

        def __getattr__(self, name):
            return getattr(inner, name)

    engine.executor = InterruptsThird()
    ids = [engine.add_request(p, greedy(6), stream=False) for p in ["interrupt me", "and me"]]
    finals = {}
    while engine.has_unfinished_requests():
        try:
            outputs = engine.step()
        except KeyboardInterrupt:
            continue
        finals.update((o.request_id, o) for o in outputs if o.finished)
    assert [finals[i].output_token_ids for i in ids] == [o.output_token_ids for o in reference]
    assert len(calls) > 3
