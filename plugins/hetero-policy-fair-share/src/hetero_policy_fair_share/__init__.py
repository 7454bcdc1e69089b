"""hetero-policy-fair-share: the engine's tokens shared fairly across tenants.

Registers the scheduler policy ``fair-share`` through the ``hetero`` entry-point group.
"""

from hetero_core import hookimpl
from hetero_policy_fair_share.policy import FairShareOptions, FairSharePolicy

__all__ = ["FairShareOptions", "FairSharePolicy"]


@hookimpl
def register_scheduler_policies(register):
    register("fair-share", FairSharePolicy, options=FairShareOptions)
