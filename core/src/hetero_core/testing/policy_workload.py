"""Driving a real engine with the policy under test: what ``SchedulerPolicyContract`` runs its
generated workloads through (no hypothesis here).

The engine runs on the kit's own ``ContractExecutor`` (no model, no plugin package) with the byte
tokenizer. After every step the kit checks what the engine would otherwise forgive: an invalid
decision (the engine logs it and falls back to arrival order for that step) and hold-backs the
engine had to override (nothing ran and every request was held back for ``MAX_STEPS_HELD_BACK``
steps) fail the kit, naming the decision; so do a leaked or doubly owned KV block and a workload
that never drains.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hetero_core.builder import build_engine
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.plugin_system.hookspecs import hookimpl
from hetero_core.policy import MAX_STEPS_HELD_BACK, decision_problems
from hetero_core.settings import load_settings
from hetero_core.testing.contract_executor import ContractExecutor
from hetero_core.testing.contract_failure import ContractFailure

MAX_STEPS = 2000  # a workload the kit generates drains in far fewer
VALID = "every decision is valid (the engine ignores an invalid one and serves in arrival order)"
NO_STALL = "a policy may delay requests, never stall the engine"


@dataclass(frozen=True)
class Arrival:
    step: int  # the engine step before which the request arrives
    prompt_len: int
    max_tokens: int
    priority: int
    tenant: str | None
    abort_at: int | None  # the step before which the caller aborts it (None: never)


@dataclass
class WorkloadResult:
    batches: list  # every Batch the executor ran, in order
    outputs: dict  # arrival index -> final RequestOutput


class PolicyUnderTest:
    """Hands the engine the policy's decisions unchanged, keeping what the kit reports if the engine
    has to forgive one: the first invalid decision, and what the policy held back while nothing ran."""

    def __init__(self, policy) -> None:
        if not callable(getattr(policy, "decide", None)):
            raise ContractFailure(
                "a policy has decide(snapshot) -> SchedulingDecision",
                f"make_policy() returned a {type(policy).__name__} without it",
            )
        self.policy = policy
        self.name = getattr(policy, "name", type(policy).__name__)
        self.first_problem: str | None = None
        self.held_back_while_idle: list[str] = []

    def decide(self, snapshot):
        try:
            decision = self.policy.decide(snapshot)
        except Exception as exc:
            self._note(snapshot, f"decide() raised {type(exc).__name__}: {exc}")
            raise
        problems = decision_problems(snapshot, decision)
        if problems:
            self._note(snapshot, f"{'; '.join(problems)} (the decision: {decision!r})")
        elif not snapshot.running and snapshot.waiting + snapshot.swapped:
            self.held_back_while_idle = sorted(decision.hold_back)
        return decision

    def _note(self, snapshot, problem: str) -> None:
        if self.first_problem is None:
            self.first_problem = f"step {snapshot.step}: {problem}"


class KitPlugin:
    """Registers the policy under test and the kit's executor, as an installed plugin would."""

    def __init__(self, make_policy) -> None:
        self.make_policy = make_policy
        self.policy: PolicyUnderTest | None = None
        self.executor: ContractExecutor | None = None

    @hookimpl
    def register_scheduler_policies(self, register):
        register("policy-under-test", self._create_policy)

    @hookimpl
    def register_executors(self, register):
        register("contract", self._create_executor, needs_model=False)

    def _create_policy(self, options):
        self.policy = PolicyUnderTest(self.make_policy())
        return self.policy

    def _create_executor(self, ctx):
        self.executor = ContractExecutor(ctx)
        return self.executor

    def check_engine_forgave_nothing(self, engine) -> None:
        stats = engine.stats()
        if stats.num_invalid_policy_decisions:
            raise ContractFailure(
                VALID, self.policy.first_problem or f"{stats.num_invalid_policy_decisions} invalid"
            )
        if stats.num_policy_hold_back_overrides:
            raise ContractFailure(
                NO_STALL,
                f"nothing ran and it held back every request "
                f"({self.policy.held_back_while_idle}) for {MAX_STEPS_HELD_BACK} steps in a row, "
                "so the engine overrode its hold-backs",
            )


def build_engine_for(make_policy, **overrides):
    """An engine on the kit's executor with the policy ``make_policy()`` returns; (engine, KitPlugin)."""
    kit = KitPlugin(make_policy)
    plugins = load_plugins(entry_points=[], extra_plugins=[("policy-contract", kit)])
    settings = load_settings(
        executor="contract", tokenizer="byte", scheduler_policy="policy-under-test", **overrides
    )
    return build_engine(settings, plugins), kit


def run_workload(make_policy, workload: list[Arrival], **overrides) -> WorkloadResult:
    """Run ``workload`` (arrivals and aborts at given steps) to the end; check after every step."""
    engine, kit = build_engine_for(make_policy, **overrides)
    ids, outputs, step = {}, {}, 0
    params = [SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True) for a in workload]
    while len(ids) < len(workload) or engine.has_unfinished_requests():
        for i, arrival in enumerate(workload):
            if arrival.step == step:
                prompt = [32 + (7 * i + j) % 90 for j in range(arrival.prompt_len)]
                ids[i] = engine.add_request(
                    prompt, params[i], priority=arrival.priority, tenant=arrival.tenant
                )
            if arrival.abort_at == step and i in ids:
                engine.abort(ids[i])
        outputs.update((o.request_id, o) for o in engine.step() if o.finished)
        kit.check_engine_forgave_nothing(engine)
        check_allocator(engine.scheduler)
        step += 1
        if step >= MAX_STEPS:
            unfinished = sorted(i for i in ids if ids[i] not in outputs)
            raise ContractFailure(
                "every admissible request finishes",
                f"arrivals {unfinished} still unfinished after {MAX_STEPS} steps",
            )
    return WorkloadResult(kit.executor.batches, {i: outputs[ids[i]] for i in sorted(ids)})


def check_allocator(scheduler) -> None:
    """Reference counts equal owners, no block is free and owned, free + used = total."""
    rule = "no KV block is leaked or owned without being counted"
    allocator = scheduler.allocator
    owners = Counter(b for seq in scheduler.running for b in seq.block_table)
    for seq in scheduler.waiting + scheduler.swapped:
        if seq.block_table:
            raise ContractFailure(
                rule, f"request {seq.request_id} holds blocks {seq.block_table} while not running"
            )
    for block, count in owners.items():
        if allocator.ref_count(block) != count:
            raise ContractFailure(
                rule, f"block {block} has {allocator.ref_count(block)} references, {count} owners"
            )
    if allocator.num_used_blocks != len(owners):
        raise ContractFailure(
            rule, f"{allocator.num_used_blocks} blocks in use, {len(owners)} owned (a leak)"
        )
    if allocator.num_free_blocks + allocator.num_used_blocks != allocator.num_blocks:
        raise ContractFailure(
            rule,
            f"free {allocator.num_free_blocks} + used {allocator.num_used_blocks} "
            f"!= {allocator.num_blocks} blocks",
        )
