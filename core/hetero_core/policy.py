"""What a scheduler-policy author imports: the snapshot types, the decision, the sort-key base class
and the hook marker. See docs/scheduling.md ("Write a scheduler policy").

    from hetero_core.policy import SortKeyPolicy, hookimpl

    class ShortestFirst(SortKeyPolicy):
        name = "shortest"

        def key(self, request):
            return request.num_prompt_tokens

    @hookimpl
    def register_scheduler_policies(register):
        register("shortest", lambda options: ShortestFirst())
"""

from hetero_core.engine.policy import (
    MAX_STEPS_HELD_BACK,
    RequestView,
    SchedulerPolicy,
    SchedulerSnapshot,
    SchedulingDecision,
    SortKeyPolicy,
    decision_problems,
)
from hetero_core.plugin_system.hookspecs import hookimpl

__all__ = [
    "MAX_STEPS_HELD_BACK",
    "RequestView",
    "SchedulerPolicy",
    "SchedulerSnapshot",
    "SchedulingDecision",
    "SortKeyPolicy",
    "decision_problems",
    "hookimpl",
]
