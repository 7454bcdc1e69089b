"""The policy conformance kit, run against the built-in policies."""

from hetero_core.engine.policy import FcfsPolicy, PriorityPolicy
from hetero_core.testing.policy_contract import SchedulerPolicyContract


class TestFcfsPolicy(SchedulerPolicyContract):
    def make_policy(self):
        return FcfsPolicy()


class TestPriorityPolicy(SchedulerPolicyContract):
    def make_policy(self):
        return PriorityPolicy()


def kit_for(policy_class):
    return type("Kit", (SchedulerPolicyContract,), {"make_policy": lambda self: policy_class()})()


def test_the_kit_catches_a_policy_that_decides_differently_for_the_same_input():
    import random

    import pytest

    from hetero_core.engine.policy import SortKeyPolicy

    rng = random.Random(0)

    class Drifting(SortKeyPolicy):  # a generator shared across engines: a second run sees other keys
        def key(self, request):
            return rng.random()

    from hetero_core.testing.policy_contract import Arrival

    workload = [Arrival(0, 10 + i, 4, 0, None, None) for i in range(8)]  # more than one step's batch
    kit = kit_for(Drifting)
    with pytest.raises(AssertionError):
        kit.test_same_input_gives_the_same_schedule.hypothesis.inner_test(kit, workload=workload)
    fcfs = kit_for(FcfsPolicy)  # the same workload passes with a deterministic policy
    fcfs.test_same_input_gives_the_same_schedule.hypothesis.inner_test(fcfs, workload=workload)


def test_the_kit_catches_an_invalid_decision():
    import pytest

    from hetero_core.engine.policy import SchedulingDecision

    class ForgetsWaiting:
        name = "forgets-waiting"

        def decide(self, snapshot):
            return SchedulingDecision(order=tuple(r.request_id for r in snapshot.running))

    with pytest.raises(AssertionError):
        kit_for(ForgetsWaiting).test_decisions_are_valid()
