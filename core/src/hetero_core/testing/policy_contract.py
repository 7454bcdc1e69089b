"""SchedulerPolicyContract: the conformance tests a scheduler policy runs in its own test suite.

    from hetero_core.testing import SchedulerPolicyContract

    class TestMyPolicy(SchedulerPolicyContract):
        def make_policy(self):
            return MyPolicy()

Every test drives generated workloads (hypothesis) through a real engine with a fresh policy per
engine, on the kit's own executor (``ContractExecutor``: deterministic, no model; no executor plugin
needed), and checks what the engine promises whatever the policy decides: budgets respected, no KV
block owned twice, every admissible request finishes, the same decisions for the same input, and
preemption (by recompute or swap) never changes output. It also fails a policy the engine had to
forgive: an invalid decision (which the engine replaces with arrival order) or holding every request
back until the engine overrode it (``policy_workload``). Each failure is a ``ContractFailure`` naming
the rule and the offending value. Needs hypothesis: ``pip install 'hetero-core[testing]'``.
"""

from __future__ import annotations

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        "SchedulerPolicyContract generates workloads with hypothesis, which is not installed: "
        "pip install 'hetero-core[testing]'"
    ) from exc

from hetero_core.policy import RequestView, SchedulerSnapshot, decision_problems
from hetero_core.testing.contract_failure import ContractFailure
from hetero_core.testing.policy_workload import VALID, Arrival, WorkloadResult, build_engine_for, run_workload

__all__ = ["ARRIVALS", "TIGHT", "WORKLOADS", "Arrival", "SchedulerPolicyContract", "WorkloadResult"]

# One test function serves every policy class that mixes the kit in: hypothesis must not mix their examples.
EXAMPLES = settings(
    max_examples=20,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
)

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
TIGHT = dict(
    block_size=4,
    max_num_blocks=24,
    max_batch_size=4,
    max_total_tokens=32,
    max_model_len=64,
    memory_threshold=1.0,
    max_prefill_chunk=12,
)


@st.composite
def snapshots(draw) -> SchedulerSnapshot:
    """A scheduler state as a policy sees it: requests waiting, running (prefill or decode) or swapped."""
    queues: dict[str, list[RequestView]] = {"waiting": [], "running": [], "swapped": []}
    for i in range(draw(st.integers(1, 10))):
        prompt = draw(st.integers(1, 40))
        state = draw(st.sampled_from(["waiting", "prefill", "decode", "swapped"]))
        outputs = draw(st.integers(1, 11)) if state in ("decode", "swapped") else 0
        computed = {"decode": prompt + outputs - 1, "prefill": draw(st.integers(0, prompt - 1))}.get(state, 0)
        view = RequestView(
            request_id=f"r{i}",
            arrival_order=i,
            arrival_time=float(i),
            priority=draw(st.integers(-2, 2)),
            tenant=draw(st.sampled_from([None, "alice", "bob"])),
            state=state,
            num_prompt_tokens=prompt,
            num_computed_tokens=computed,
            num_output_tokens=outputs,
            num_cached_prefix_tokens=0,
            max_tokens=12,
            num_preemptions=draw(st.integers(0, 2)) if state in ("waiting", "swapped") else 0,
        )
        queues["running" if state in ("prefill", "decode") else state].append(view)
    return SchedulerSnapshot(
        step=draw(st.integers(0, 50)),
        waiting=tuple(queues["waiting"]),
        running=tuple(queues["running"]),
        swapped=tuple(queues["swapped"]),
        num_free_blocks=draw(st.integers(0, TIGHT["max_num_blocks"])),
        num_cached_blocks=0,
        num_total_blocks=TIGHT["max_num_blocks"],
        block_size=TIGHT["block_size"],
        max_num_batched_tokens=TIGHT["max_total_tokens"],
        max_batch_size=TIGHT["max_batch_size"],
        max_num_seqs=TIGHT["max_batch_size"],
    )


class SchedulerPolicyContract:
    """Mix into a test class and define ``make_policy()`` (a new policy object each call)."""

    def make_policy(self):
        raise NotImplementedError("define make_policy() to return a fresh policy")

    # -- the contract -----------------------------------------------------------------------------
    @EXAMPLES
    @given(workload=WORKLOADS)
    def test_budgets_hold_blocks_are_owned_once_and_every_request_finishes(self, workload):
        result = self.run_workload(workload, **TIGHT)
        for step, batch in enumerate(result.batches):
            if batch.num_seqs > TIGHT["max_batch_size"] or batch.num_tokens > TIGHT["max_total_tokens"]:
                raise ContractFailure(
                    "a step stays within max_batch_size and max_total_tokens",
                    f"step {step}: {batch.num_seqs} sequences, {batch.num_tokens} tokens "
                    f"(limits {TIGHT['max_batch_size']}, {TIGHT['max_total_tokens']})",
                )
        for i, (arrival, output) in enumerate(zip(workload, result.outputs.values())):
            done = output.finished and not output.failed
            complete = done and len(output.output_token_ids) == arrival.max_tokens
            if output.finish_reason != "abort" and not complete:
                raise ContractFailure(
                    "every admissible request finishes with its max_tokens",
                    f"request {i} ({arrival}): finish_reason {output.finish_reason}, "
                    f"{len(output.output_token_ids)} tokens, error {output.error!r}",
                )

    @EXAMPLES
    @given(workload=WORKLOADS)
    def test_same_input_gives_the_same_schedule(self, workload):
        runs = [
            [(b.seq_ids, b.token_ids) for b in self.run_workload(workload, **TIGHT).batches] for _ in range(2)
        ]
        if runs[0] != runs[1]:
            step = next((k for k, (a, b) in enumerate(zip(*runs)) if a != b), min(map(len, runs)))
            first, second = (run[step][0] if step < len(run) else "nothing" for run in runs)
            raise ContractFailure(
                "the same input gives the same schedule (no hash, set or time order)",
                f"step {step} ran sequences {first} in the first run, {second} in the second",
            )

    @EXAMPLES
    @given(workload=WORKLOADS, mode=st.sampled_from(["recompute", "swap"]))
    def test_preemption_never_changes_output(self, workload, mode):
        workload = [Arrival(a.step, a.prompt_len, a.max_tokens, a.priority, a.tenant, None) for a in workload]
        roomy = self.run_workload(workload, **{**TIGHT, "max_num_blocks": 512})
        tight = self.run_workload(workload, **TIGHT, preemption_mode=mode, num_swap_blocks=8)
        for i, (want, got) in enumerate(zip(roomy.outputs.values(), tight.outputs.values())):
            if got.output_token_ids != want.output_token_ids:
                raise ContractFailure(
                    f"preemption ({mode}) never changes output",
                    f"request {i}: {got.output_token_ids} in a tight pool, "
                    f"{want.output_token_ids} in a roomy one",
                )

    @EXAMPLES
    @given(snapshot=snapshots())
    def test_decisions_are_valid(self, snapshot):
        policy = self.make_policy()
        try:
            decision = policy.decide(snapshot)
        except Exception as exc:
            raise ContractFailure(
                "decide(snapshot) returns a SchedulingDecision", f"it raised {type(exc).__name__}: {exc}"
            ) from exc
        problems = decision_problems(snapshot, decision)
        if problems:
            ids = {k: [r.request_id for r in getattr(snapshot, k)] for k in ("waiting", "running", "swapped")}
            raise ContractFailure(
                VALID, f"{'; '.join(problems)} for a snapshot with {ids} (the decision: {decision!r})"
            )

    # -- helpers ----------------------------------------------------------------------------------
    def make_engine(self, policy_factory=None, **overrides):
        """An engine with ``policy_factory()`` (default: ``make_policy``) on the kit's executor."""
        return build_engine_for(policy_factory or self.make_policy, **overrides)[0]

    def run_workload(self, workload: list[Arrival], **overrides) -> WorkloadResult:
        return run_workload(self.make_policy, workload, **overrides)
