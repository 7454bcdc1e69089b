"""What a scheduler-policy author imports: the snapshot types, the decision, and the sort-key base
class. See docs/scheduling.md ("Write a scheduler policy").

    from hetero_core import hookimpl
    from hetero_core.policy import SortKeyPolicy

    class ShortestFirst(SortKeyPolicy):
        name = "shortest"

        def key(self, request):
            return request.num_prompt_tokens

    @hookimpl
    def register_scheduler_policies(register):
        register("shortest", lambda options: ShortestFirst())
"""

from hetero_core.engine.scheduling.policy import (
    MAX_STEPS_HELD_BACK,
    RequestView,
    SchedulerPolicy,
    SchedulerSnapshot,
    SchedulingDecision,
    SortKeyPolicy,
    decision_problems,
)

# ``hookimpl`` is ``hetero_core.hookimpl``, kept here for the code that imported it from this facade
from hetero_core.plugin_system.hookspecs import hookimpl as hookimpl

__all__ = [
    "MAX_STEPS_HELD_BACK",
    "RequestView",
    "SchedulerPolicy",
    "SchedulerSnapshot",
    "SchedulingDecision",
    "SortKeyPolicy",
    "decision_problems",
]
