"""SchedulerPolicyContract: the conformance tests a scheduler policy runs in its own test suite.

    from hetero_core.testing.policy_contract import SchedulerPolicyContract

    class TestMyPolicy(SchedulerPolicyContract):
        def make_policy(self):
            return MyPolicy()

Every test drives generated workloads (hypothesis) through a real engine on the mock executor
(``hetero-plugins-mock``) with a fresh policy per engine, and checks what the engine promises whatever
the policy decides: budgets respected, no KV block owned twice, every admissible request finishes,
the same decisions for the same input, and preemption (by recompute or swap) never changes output.
Needs ``hypothesis`` and ``hetero-plugins-mock`` installed (the test extra of hetero-core).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings, strategies as st

from hetero_core.engine.params import SamplingParams
from hetero_core.engine.policy import SchedulingDecision, decision_problems
from hetero_core.engine.policy_runner import view_of
from hetero_core.engine.sequence import Sequence, SequenceStatus
from hetero_core.plugin_system.hookspecs import hookimpl

# One test function serves every policy class that mixes the kit in: hypothesis must not mix their examples.
EXAMPLES = settings(max_examples=20, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors])


@dataclass(frozen=True)
class Arrival:
    step: int  # the engine step before which the request arrives
    prompt_len: int
    max_tokens: int
    priority: int
    tenant: str | None
    abort_at: int | None  # the step before which the caller aborts it (None: never)


ARRIVALS = st.builds(
    Arrival,
    step=st.integers(0, 8),
    prompt_len=st.integers(1, 40),
    max_tokens=st.integers(1, 12),
    priority=st.integers(-2, 2),
    tenant=st.sampled_from([None, "alice", "bob", "carol"]),
    abort_at=st.none() | st.integers(1, 20),
)
WORKLOADS = st.lists(ARRIVALS, min_size=1, max_size=10)
TIGHT = dict(block_size=4, max_num_blocks=24, max_batch_size=4, max_total_tokens=32, max_model_len=64,
             memory_threshold=1.0, max_prefill_chunk=12)


class _PolicyPlugin:
    def __init__(self, make_policy):
        self.make_policy = make_policy

    @hookimpl
    def register_scheduler_policies(self, register):
        register("policy-under-test", lambda options: self.make_policy())


class SchedulerPolicyContract:
    """Mix into a test class and define ``make_policy()`` (a new policy object each call)."""

    def make_policy(self):
        raise NotImplementedError("define make_policy() to return a fresh policy")

    # -- the contract -----------------------------------------------------------------------------
    @EXAMPLES
    @given(workload=WORKLOADS)
    def test_budgets_hold_blocks_are_owned_once_and_every_request_finishes(self, workload):
        result = self.run_workload(workload, **TIGHT)
        for batch in result.batches:
            assert batch.num_seqs <= TIGHT["max_batch_size"], "more sequences than max_batch_size in a step"
            assert batch.num_tokens <= TIGHT["max_total_tokens"], "more tokens than max_total_tokens in a step"
        assert all(o.finished for o in result.outputs.values()), "a request never finished"
        for arrival, output in zip(workload, result.outputs.values()):
            if output.finish_reason != "abort":
                assert not output.failed and len(output.output_token_ids) == arrival.max_tokens

    @EXAMPLES
    @given(workload=WORKLOADS)
    def test_same_input_gives_the_same_schedule(self, workload):
        first = self.run_workload(workload, **TIGHT)
        second = self.run_workload(workload, **TIGHT)
        assert [(b.seq_ids, b.token_ids) for b in first.batches] == [(b.seq_ids, b.token_ids) for b in second.batches]

    @EXAMPLES
    @given(workload=WORKLOADS, mode=st.sampled_from(["recompute", "swap"]))
    def test_preemption_never_changes_output(self, workload, mode):
        workload = [Arrival(a.step, a.prompt_len, a.max_tokens, a.priority, a.tenant, None) for a in workload]
        roomy = self.run_workload(workload, **{**TIGHT, "max_num_blocks": 512})
        tight = self.run_workload(workload, **TIGHT, preemption_mode=mode, num_swap_blocks=8)
        tokens = lambda result: [o.output_token_ids for o in result.outputs.values()]  # noqa: E731
        assert tokens(tight) == tokens(roomy)

    @EXAMPLES
    @given(workload=WORKLOADS, data=st.data())
    def test_decisions_are_valid(self, workload, data):
        policy = self.make_policy()
        scheduler = self.make_engine(policy_factory=lambda: policy, **TIGHT).scheduler
        for i, arrival in enumerate(workload):
            seq = Sequence(i, f"r{i}", "", [65] * arrival.prompt_len, SamplingParams(max_tokens=arrival.max_tokens),
                           float(i), priority=arrival.priority, tenant=arrival.tenant)
            state = data.draw(st.sampled_from(["waiting", "running"]))
            if state == "running":
                seq.status, seq.num_computed_tokens = SequenceStatus.PREFILL, data.draw(st.integers(0, arrival.prompt_len - 1))
            (scheduler.running if state == "running" else scheduler.waiting).append(seq)
        snapshot = scheduler.snapshot()
        decision = policy.decide(snapshot)
        assert isinstance(decision, SchedulingDecision)
        assert decision_problems(snapshot, decision) == []
        assert all(view_of(s).request_id in decision.order for s in scheduler.running + scheduler.waiting)

    # -- helpers ----------------------------------------------------------------------------------
    def make_engine(self, policy_factory=None, **overrides):
        import hetero_plugins_mock

        from hetero_core.builder import build_engine
        from hetero_core.plugin_system.discovery import load_plugins
        from hetero_core.settings import load_settings

        plugin = _PolicyPlugin(policy_factory or self.make_policy)
        plugins = load_plugins(entry_points=[], extra_plugins=[("mock", hetero_plugins_mock), ("contract", plugin)])
        settings_ = load_settings(executor="mock", scheduler_policy="policy-under-test", **overrides)
        return build_engine(settings_, plugins)

    def run_workload(self, workload: list[Arrival], **overrides) -> "WorkloadResult":
        engine = self.make_engine(**overrides)
        batches = []
        execute = engine.executor.execute
        engine.executor.execute = lambda batch: batches.append(batch) or execute(batch)
        ids, outputs, step = {}, {}, 0
        params = [SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True) for a in workload]
        while len(ids) < len(workload) or engine.has_unfinished_requests():
            for i, arrival in enumerate(workload):
                if arrival.step == step:
                    prompt = [32 + (7 * i + j) % 90 for j in range(arrival.prompt_len)]
                    ids[i] = engine.add_request(prompt, params[i], priority=arrival.priority, tenant=arrival.tenant)
                if arrival.abort_at == step and i in ids:
                    engine.abort(ids[i])
            outputs.update((o.request_id, o) for o in engine.step() if o.finished)
            check_allocator(engine.scheduler)
            step += 1
            assert step < 2000, "the engine did not drain the workload"
        return WorkloadResult(batches, {i: outputs[ids[i]] for i in sorted(ids)})


@dataclass
class WorkloadResult:
    batches: list
    outputs: dict  # arrival index -> RequestOutput


def check_allocator(scheduler) -> None:
    """Reference counts equal owners, no block is free and owned, free + used = total."""
    allocator = scheduler.allocator
    owners = Counter(b for seq in scheduler.running for b in seq.block_table)
    for seq in scheduler.waiting + scheduler.swapped:
        assert not seq.block_table, f"request {seq.request_id} holds blocks while not running"
    for block, count in owners.items():
        assert allocator.ref_count(block) == count, f"block {block}: {allocator.ref_count(block)} refs, {count} owners"
    assert allocator.num_used_blocks == len(owners), "a block is in use without an owner (leak)"
    assert allocator.num_free_blocks + allocator.num_used_blocks == allocator.num_blocks
