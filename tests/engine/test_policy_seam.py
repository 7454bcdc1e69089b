"""The policy seam: snapshots in, decisions out; core validates, applies and overrides."""

import dataclasses
import logging

import pytest

from hetero_core.engine.requests.params import SamplingParams
from hetero_core.engine.scheduling.policy import SchedulingDecision, SortKeyPolicy
from hetero_core.errors import ConfigError, InvalidRequestError


def greedy(max_tokens=4):
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def engine_with_policy(make_mock_engine, policy, **settings):
    engine = make_mock_engine(**settings)
    engine.scheduler.runner.policy = policy
    return engine


class Recorder(SortKeyPolicy):
    name = "recorder"

    def __init__(self):
        self.snapshots = []

    def key(self, request):
        return request.arrival_order

    def decide(self, snapshot):
        self.snapshots.append(snapshot)
        return super().decide(snapshot)


def test_policies_see_frozen_snapshots_with_priority_tenant_and_counts(make_mock_engine):
    policy = Recorder()
    engine = engine_with_policy(make_mock_engine, policy)
    engine.add_request("hello there", greedy(), priority=3, tenant="team-a")
    engine.step()
    engine.step()
    view = policy.snapshots[-1].running[0]
    assert (view.priority, view.tenant, view.state) == (3, "team-a", "decode")
    assert (view.num_prompt_tokens, view.num_computed_tokens, view.num_output_tokens) == (11, 11, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.priority = 0
    assert isinstance(policy.snapshots[0].waiting, tuple)


@pytest.mark.parametrize(
    "priority, tenant", [(1.5, None), (True, None), ("1", None), (0, ""), (0, 7), (0, "x" * 300)]
)
def test_bad_priority_or_tenant_is_an_invalid_request(make_mock_engine, priority, tenant):
    engine = make_mock_engine()
    with pytest.raises(InvalidRequestError, match="priority|tenant"):
        engine.add_request("hi", priority=priority, tenant=tenant)
    assert not engine.has_unfinished_requests()


def test_the_priority_policy_serves_lower_values_first(make_mock_engine, recording):
    engine = make_mock_engine(scheduler_policy="priority", max_batch_size=1)
    rec = recording(engine)
    late = engine.add_request("bbbb", greedy(1), priority=5)
    urgent = engine.add_request("aaaa", greedy(1), priority=-1)
    engine.step()
    assert rec.batches[0].seq_ids == [1]  # the second arrival, priority -1
    assert (late, urgent) == ("0", "1")


def test_the_priority_policy_preempts_a_less_urgent_request_for_an_urgent_one(make_mock_engine):
    engine = make_mock_engine(
        scheduler_policy="priority", max_num_blocks=8, block_size=4, memory_threshold=1.0
    )
    low = engine.add_request("l" * 20, greedy(8), priority=9)
    engine.step()
    urgent = engine.add_request("u" * 20, greedy(8), priority=0)
    finished = {}
    while engine.has_unfinished_requests():
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
    assert finished[low].num_preemptions >= 1 and finished[urgent].num_preemptions == 0
    assert finished[urgent].finish_time <= finished[low].finish_time
    alone = make_mock_engine().generate(["l" * 20], greedy(8))[0]
    assert finished[low].output_token_ids == alone.output_token_ids


class Broken(SortKeyPolicy):
    name = "broken"

    def __init__(self, decision):
        self.decision = decision

    def decide(self, snapshot):
        return self.decision(snapshot)


@pytest.mark.parametrize(
    "bad",
    [
        lambda s: None,
        lambda s: SchedulingDecision(order=()),
        lambda s: SchedulingDecision(order=tuple(r.request_id for r in s.requests) * 2),
        lambda s: SchedulingDecision(order=tuple(r.request_id for r in s.requests) + ("ghost",)),
        lambda s: SchedulingDecision(order=tuple(r.request_id for r in s.requests), preempt=("ghost",)),
        lambda s: 1 / 0,
    ],
)
def test_an_invalid_decision_is_reported_with_the_policy_name_and_the_engine_goes_on(
    make_mock_engine, caplog, bad
):
    engine = engine_with_policy(make_mock_engine, Broken(bad))
    engine.scheduler.runner.name = "broken"
    with caplog.at_level(logging.WARNING, logger="hetero"):
        outputs = engine.generate(["one", "two"], greedy())
    assert all(len(o.output_token_ids) == 4 for o in outputs)
    assert "policy.invalid_decision" in caplog.text and "broken" in caplog.text
    assert engine.stats().num_invalid_policy_decisions > 0


def test_a_policy_holding_everything_back_is_overridden_after_a_bounded_time(make_mock_engine, caplog):
    from hetero_core.engine.scheduling.policy import MAX_STEPS_HELD_BACK

    def hold_all(s):
        ids = tuple(r.request_id for r in s.requests)
        return SchedulingDecision(order=ids, hold_back=frozenset(r.request_id for r in s.waiting))

    engine = engine_with_policy(make_mock_engine, Broken(hold_all))
    engine.scheduler.runner.name = "stingy"
    engine.add_request("held", greedy())
    with caplog.at_level(logging.WARNING, logger="hetero"):
        steps = 0
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
    # The engine schedules at most twice per step (a second round after a step that only preempted),
    # so the policy's MAX_STEPS_HELD_BACK scheduling rounds take between half and all as many steps.
    assert MAX_STEPS_HELD_BACK // 2 < steps <= MAX_STEPS_HELD_BACK + 10
    assert engine.scheduler.runner.num_hold_back_overrides >= 1
    assert "policy.hold_back_overridden" in caplog.text and "stingy" in caplog.text


def test_a_policy_without_decide_is_a_config_error():
    from hetero_core.engine.scheduling.policy_runner import PolicyRunner

    class Legacy:
        def priority(self, seq):
            return 0

    with pytest.raises(ConfigError, match="scheduler policy 'legacy'.*decide"):
        PolicyRunner(Legacy(), "legacy")


def test_priority_and_tenant_from_the_cli(capsys):
    from hetero_core.cli.main import main

    code = main(["run", "--executor", "mock", "--max-tokens", "3", "--priority", "2", "--tenant", "me", "hi"])
    assert code == 0
    assert "prefix cache" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--executor", "mock", "--priority", "soon", "hi"])
    assert exit_info.value.code == 2
    assert "--priority: invalid int value: 'soon'" in capsys.readouterr().err
