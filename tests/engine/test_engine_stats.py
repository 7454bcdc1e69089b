"""engine.stats() and the step's shape: counters kept up to date equal a recount after every step,
schedule() runs once per engine step, and a step that only preempts applies its swap-outs at once."""

import hetero_plugins_mock
from hetero_core.builder import build_engine
from hetero_core.default_plugins.policies import FcfsPolicy
from hetero_core.engine.requests.params import SamplingParams
from hetero_core.engine.scheduling.policy import SchedulingDecision
from hetero_core.plugin_system.discovery import load_plugins
from hetero_core.plugin_system.hookspecs import hookimpl
from hetero_core.settings import load_settings

PROMPTS = [f"request number {i} " * (1 + i % 5) for i in range(12)]
TIGHT = dict(max_num_blocks=32, block_size=4, memory_threshold=1.0)


def greedy(max_tokens=24):
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


class Calls:
    """Wraps an executor: records batches and block transfers, with the engine step they came in."""

    def __init__(self, inner, fail_at=()):
        self.inner, self.fail_at = inner, set(fail_at)
        self.capabilities = inner.capabilities
        self.step, self.events = 0, []

    def execute(self, batch):
        self.events.append((self.step, "execute", batch.num_seqs, batch.num_tokens))
        if self.step in self.fail_at:
            raise RuntimeError("injected")
        return self.inner.execute(batch)

    def swap_out(self, pairs):
        self.events.append((self.step, "swap_out", len(pairs)))
        self.inner.swap_out(pairs)

    def swap_in(self, pairs):
        self.events.append((self.step, "swap_in", len(pairs)))
        self.inner.swap_in(pairs)

    def copy_blocks(self, pairs):
        self.inner.copy_blocks(pairs)

    def shutdown(self):
        self.inner.shutdown()


def recount(engine) -> dict:
    scheduler = engine.scheduler
    queued = [s for q in (scheduler.running, scheduler.waiting, scheduler.swapped) for s in q]
    return dict(
        num_running=len(scheduler.running),
        num_waiting=len(scheduler.waiting),
        num_swapped=len(scheduler.swapped),
        num_free_blocks=scheduler.allocator.num_free_blocks,
        num_blocks=scheduler.allocator.num_blocks,
        num_cached_blocks=scheduler.allocator.num_cached_blocks,
        num_queued_tokens=sum(
            s.num_prompt_tokens + max(0, s.params.max_tokens - s.num_output_tokens) for s in queued
        ),
    )


def test_stats_equal_a_recount_after_every_step(make_mock_engine):
    engine = make_mock_engine(preemption_mode="swap", mock_options={"eos_after": 9}, **TIGHT)
    calls = engine.executor = Calls(engine.executor, fail_at={6})
    ids = [
        engine.add_request(p, SamplingParams(temperature=0, max_tokens=6 + i)) for i, p in enumerate(PROMPTS)
    ]
    while engine.has_unfinished_requests():
        calls.step += 1
        if calls.step == 4:
            engine.abort(ids[3])
        engine.step()
        stats = engine.stats()
        assert {k: getattr(stats, k) for k in recount(engine)} == recount(engine), calls.step
        batch = [e for e in calls.events if e[0] == calls.step and e[1] == "execute"]
        assert (stats.last_step_num_seqs, stats.last_step_num_tokens) == (batch[0][2:] if batch else (0, 0))
    stats = engine.stats()
    assert stats.num_queued_tokens == 0 and stats.num_free_blocks == stats.num_blocks == 32
    assert stats.num_preemptions > 0 and stats.num_steps >= calls.step


def test_schedule_runs_once_per_engine_step(make_mock_engine):
    engine = make_mock_engine(**TIGHT)
    calls, schedule = [], engine.scheduler.schedule
    engine.scheduler.schedule = lambda: calls.append(1) or schedule()
    num_steps = 0
    for prompt in PROMPTS:
        engine.add_request(prompt, greedy())
    while engine.has_unfinished_requests():
        engine.step()
        num_steps += 1
    assert len(calls) == num_steps and engine.stats().num_preemptions > 0


class PreemptEverythingOnce(FcfsPolicy):
    """Once two requests decode: preempt every running request and hold everything back for two passes."""

    name = "preempt-once"

    def __init__(self):
        self.num_held_passes = None

    def decide(self, snapshot):
        order = super().decide(snapshot).order
        pending = frozenset(r.request_id for r in snapshot.waiting + snapshot.swapped)
        if self.num_held_passes is None and sum(r.state == "decode" for r in snapshot.running) >= 2:
            self.num_held_passes = 1
            return SchedulingDecision(
                order, hold_back=pending, preempt=tuple(r.request_id for r in snapshot.running)
            )
        if self.num_held_passes == 1:
            self.num_held_passes = 2
            return SchedulingDecision(order, hold_back=pending)
        return SchedulingDecision(order)


class PolicyPlugin:
    @hookimpl
    def register_scheduler_policies(self, register):
        register("preempt-once", lambda options: PreemptEverythingOnce())


def test_a_step_that_only_preempts_applies_its_swap_outs_at_once(make_mock_engine):
    reference = make_mock_engine().generate(PROMPTS[:4], greedy(12))
    plugins = load_plugins(
        entry_points=[], extra_plugins=[("mock", hetero_plugins_mock), ("policy", PolicyPlugin())]
    )
    engine = build_engine(
        load_settings(executor="mock", scheduler_policy="preempt-once", preemption_mode="swap"), plugins
    )
    calls = engine.executor = Calls(engine.executor)
    ids = [engine.add_request(p, greedy(12)) for p in PROMPTS[:4]]
    finished = {}
    while engine.has_unfinished_requests():
        calls.step += 1
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
    [step] = {e[0] for e in calls.events if e[1] == "swap_out"}
    assert [e[1] for e in calls.events if e[0] == step] == ["swap_out"]  # no batch ran: nothing carries over
    assert calls.events[[e[0] for e in calls.events].index(step + 1)][1] == "swap_in"
    stats = engine.stats()
    assert stats.num_swap_preemptions == stats.num_swap_ins == 4 and stats.num_policy_hold_back_overrides == 0
    assert [finished[i].output_token_ids for i in ids] == [o.output_token_ids for o in reference]
