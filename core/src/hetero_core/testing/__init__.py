"""Contract test kits for plugin authors: subclass one in your test suite and inherit every test.

``ExecutorContract``: what every executor must do with a paged batch (``executor_contract``).
``SchedulerPolicyContract``: what every scheduler policy must do in a real engine (``policy_contract``;
needs hypothesis: ``pip install 'hetero-core[testing]'``).
``ArchitectureContract``: what every model architecture must do against HF transformers
(``architecture_contract``; needs transformers).
``KVAllocatorContract``: what every KV allocator must do (``kv_allocator_contract``).
``StructuredOutputContract``: what every structured-output backend must do (``structured_output_contract``).
``KVConnectorContract``: what every KV connector must do (``kv_connector_contract``).
``ProposerContract``: what every speculative-decoding proposer must do (``proposer_contract``).
``TokenizerContract``: what every tokenizer must do, threads and decode purity included
(``tokenizer_contract``).
A broken rule raises ``ContractFailure`` naming the rule and the offending value.

The names load on first use, so importing this package imports neither torch, pytest nor hypothesis,
and one kit never needs another kit's packages.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> the module that defines it
_EXPORTS = {
    "ExecutorContract": "hetero_core.testing.executor_contract",
    "ArchitectureContract": "hetero_core.testing.architecture_contract",
    "SchedulerPolicyContract": "hetero_core.testing.policy_contract",
    "KVAllocatorContract": "hetero_core.testing.kv_allocator_contract",
    "StructuredOutputContract": "hetero_core.testing.structured_output_contract",
    "KVConnectorContract": "hetero_core.testing.kv_connector_contract",
    "ProposerContract": "hetero_core.testing.proposer_contract",
    "TokenizerContract": "hetero_core.testing.tokenizer_contract",
    "ContractFailure": "hetero_core.testing.contract_failure",
    "BlockPool": "hetero_core.testing.paged",
    "ContractSequence": "hetero_core.testing.paged",
    "build_batch": "hetero_core.testing.paged",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hetero_core.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ loads these on demand
    from hetero_core.testing.contract_failure import ContractFailure
    from hetero_core.testing.executor_contract import ExecutorContract
    from hetero_core.testing.kv_allocator_contract import KVAllocatorContract
    from hetero_core.testing.kv_connector_contract import KVConnectorContract
    from hetero_core.testing.paged import BlockPool, ContractSequence, build_batch
    from hetero_core.testing.policy_contract import SchedulerPolicyContract
    from hetero_core.testing.proposer_contract import ProposerContract
    from hetero_core.testing.structured_output_contract import StructuredOutputContract
    from hetero_core.testing.tokenizer_contract import TokenizerContract
