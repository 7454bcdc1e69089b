"""hetero-policy-fair-share: the conformance kit from hetero-core, plus the policy's own behaviour."""

from hetero_core.policy import RequestView, SchedulerSnapshot
from hetero_core.testing import SchedulerPolicyContract
from hetero_policy_fair_share import FairShareOptions, FairSharePolicy


class TestFairShareContract(SchedulerPolicyContract):
    def make_policy(self):
        return FairSharePolicy()


class TestFairShareWithCapContract(SchedulerPolicyContract):
    def make_policy(self):
        return FairSharePolicy(FairShareOptions(max_running_per_tenant=1))


def request(request_id, tenant, arrival, computed=0, state="waiting"):
    return RequestView(
        request_id=request_id,
        arrival_order=arrival,
        arrival_time=float(arrival),
        priority=0,
        tenant=tenant,
        state=state,
        num_prompt_tokens=10,
        num_computed_tokens=computed,
        num_output_tokens=0,
        num_cached_prefix_tokens=0,
        max_tokens=8,
        num_preemptions=0,
    )


def snapshot(running=(), waiting=()):
    return SchedulerSnapshot(
        step=0,
        waiting=tuple(waiting),
        running=tuple(running),
        swapped=(),
        num_free_blocks=10,
        num_cached_blocks=0,
        num_total_blocks=10,
        block_size=4,
        max_num_batched_tokens=64,
        max_batch_size=8,
        max_num_seqs=8,
    )


def test_the_least_served_tenant_goes_first():
    policy = FairSharePolicy()
    busy = [request(f"a{i}", "alice", i, computed=50, state="decode") for i in range(3)]
    decision = policy.decide(
        snapshot(running=busy, waiting=[request("a9", "alice", 9), request("b1", "bob", 10)])
    )
    assert decision.order.index("b1") < decision.order.index("a9")  # bob arrived later but has had nothing


def test_weights_scale_a_tenants_share():
    policy = FairSharePolicy(FairShareOptions(weights={"alice": 4.0}))
    running = [
        request("a", "alice", 0, computed=40, state="decode"),
        request("b", "bob", 1, computed=20, state="decode"),
    ]
    decision = policy.decide(snapshot(running=running))
    assert decision.order == ("a", "b")  # alice: 40 / 4 = 10 weighted tokens, bob: 20


def test_a_tenant_at_its_cap_is_held_back():
    policy = FairSharePolicy(FairShareOptions(max_running_per_tenant=1))
    decision = policy.decide(
        snapshot(
            running=[request("a0", "alice", 0, 5, "decode")],
            waiting=[request("a1", "alice", 1), request("b1", "bob", 2)],
        )
    )
    assert decision.hold_back == frozenset({"a1"})
