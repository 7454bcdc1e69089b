"""Scheduler policies: the order in which requests get the engine's capacity.

A policy gives each sequence a priority key; lower keys go first. The scheduler serves running
sequences in key order, admits waiting ones in key order, and preempts the running sequence with the
highest key when blocks run out. Budgets, admission limits and the KV pool stay in the scheduler,
so a policy cannot break them.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from hetero_core.engine.sequence import Sequence


@runtime_checkable
class SchedulerPolicy(Protocol):
    def priority(self, seq: Sequence) -> Any:
        """A sortable key: lower is served first. Must be deterministic (no hash order)."""
        ...


class FcfsPolicy:
    """First come, first served: the earliest request first, the newest preempted first."""

    def priority(self, seq: Sequence) -> int:
        return seq.seq_id
