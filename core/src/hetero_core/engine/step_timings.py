"""StepTimings: where the engine's time goes, per phase of a step, summed since the start.

Kept as the steps run (a few ``perf_counter`` calls per step, nothing per sequence) and read by
``hetero bench host-overhead``: schedule (the policy, admission, preemption, KV blocks), build batch
(the ``Batch`` the executor gets), execute (the executor's own time; with async scheduling, the time
the engine thread waited for it), postprocess (sampling, tokens, stop checks, detokenizing) and
outputs (the ``RequestOutput``s step() returns).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["StepTimings"]


@dataclass
class StepTimings:
    num_steps: int = 0  # steps that ran a batch
    schedule_s: float = 0.0
    build_batch_s: float = 0.0
    execute_s: float = 0.0
    postprocess_s: float = 0.0
    outputs_s: float = 0.0

    @property
    def engine_s(self) -> float:
        """The engine's own time: every phase but execute."""
        return self.schedule_s + self.build_batch_s + self.postprocess_s + self.outputs_s

    def copy(self) -> StepTimings:
        return StepTimings(**{f.name: getattr(self, f.name) for f in fields(self)})

    def minus(self, earlier: StepTimings) -> StepTimings:
        """The time spent since ``earlier`` (a ``copy()``)."""
        return StepTimings(**{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)})
