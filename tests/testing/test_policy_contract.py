"""The policy conformance kit, run against the built-in policies, and what it catches (the messages
as pytest shows them: tests/testing/test_kit_failures.py)."""

import random

import pytest

from hetero_core.default_plugins.policies import FcfsPolicy, PriorityPolicy
from hetero_core.policy import SchedulingDecision, SortKeyPolicy
from hetero_core.testing import ContractFailure, SchedulerPolicyContract
from hetero_core.testing.policy_contract import Arrival


class TestFcfsPolicy(SchedulerPolicyContract):
    def make_policy(self):
        return FcfsPolicy()


class TestPriorityPolicy(SchedulerPolicyContract):
    def make_policy(self):
        return PriorityPolicy()


def kit_for(policy_class):
    return type("Kit", (SchedulerPolicyContract,), {"make_policy": lambda self: policy_class()})()


WORKLOAD = [Arrival(0, 10 + i, 4, 0, None, None) for i in range(8)]  # more than one step's batch


def test_the_kit_catches_a_policy_that_decides_differently_for_the_same_input():
    rng = random.Random(0)

    class Drifting(SortKeyPolicy):  # a generator shared across engines: a second run sees other keys
        def key(self, request):
            return rng.random()

    kit = kit_for(Drifting)
    with pytest.raises(
        ContractFailure,
        match=r"the same input gives the same schedule \(no hash, set or time "
        r"order\): step \d+ ran sequences \[.*\] in the first run",
    ):
        kit.test_same_input_gives_the_same_schedule.hypothesis.inner_test(kit, workload=WORKLOAD)
    fcfs = kit_for(FcfsPolicy)  # the same workload passes with a deterministic policy
    fcfs.test_same_input_gives_the_same_schedule.hypothesis.inner_test(fcfs, workload=WORKLOAD)


def test_the_kit_catches_an_invalid_decision():
    class ForgetsWaiting:
        name = "forgets-waiting"

        def decide(self, snapshot):
            return SchedulingDecision(order=tuple(r.request_id for r in snapshot.running))

    with pytest.raises(ContractFailure, match=r"every decision is valid .*: order leaves out \['r"):
        kit_for(ForgetsWaiting).test_decisions_are_valid()
    with pytest.raises(
        ContractFailure, match=r"every decision is valid .*: step \d+: order leaves out \['0'"
    ):
        kit_for(ForgetsWaiting).run_workload(WORKLOAD)


def test_the_kit_catches_a_policy_that_raises():
    class Raising(SortKeyPolicy):
        def key(self, request):
            raise KeyError("tenant")

    with pytest.raises(
        ContractFailure,
        match=r"decide\(snapshot\) returns a SchedulingDecision: it raised "
        r"KeyError: 'tenant'",
    ):
        kit_for(Raising).test_decisions_are_valid()
    with pytest.raises(
        ContractFailure, match=r"every decision is valid .*: step \d+: decide\(\) raised KeyError"
    ):
        kit_for(Raising).run_workload(WORKLOAD)


def test_the_kit_catches_a_policy_that_stalls_the_engine():
    class HoldsEverythingBack(FcfsPolicy):
        def decide(self, snapshot):
            held = frozenset(r.request_id for r in snapshot.waiting + snapshot.swapped)
            return SchedulingDecision(order=super().decide(snapshot).order, hold_back=held)

    with pytest.raises(
        ContractFailure,
        match=r"never stall the engine: nothing ran and it held back every request "
        r"\(\['0', '1', .*\]\) for 64 steps in a row",
    ):
        kit_for(HoldsEverythingBack).run_workload(WORKLOAD)


def test_a_policy_object_without_decide_is_named():
    class OldStyle:
        def priority(self, seq):
            return 0

    with pytest.raises(
        ContractFailure, match="a policy has decide.*: make_policy\\(\\) returned a OldStyle without it"
    ):
        kit_for(OldStyle).run_workload(WORKLOAD)
