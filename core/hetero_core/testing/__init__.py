"""Contract test kits for plugin authors: subclass one in your test suite and inherit every test.

``ExecutorContract``: what every executor must do with a paged batch (see its module docstring).
``SchedulerPolicyContract``: what every scheduler policy must do with snapshots (``testing_policy``).
Importing this package imports neither torch nor pytest.
"""

from hetero_core.testing.executor_contract import ExecutorContract
from hetero_core.testing.paged import BlockPool, ContractSequence, build_batch
from hetero_core.testing.policy_contract import SchedulerPolicyContract

__all__ = ["BlockPool", "ContractSequence", "ExecutorContract", "build_batch", "SchedulerPolicyContract"]
