"""What a KV connector author imports: the blocks that move, the connector protocol, the context a
factory receives and the error to raise. See docs/disaggregation.md (the contract) and
docs/hooks.md (``register_kv_connectors``).

    from hetero_core import hookimpl
    from hetero_core.kv_transfer import KVBlocks, KVConnectorContext, KVTransferError

    class MyConnector:  # e.g. RDMA / NIXL / Mooncake-style
        def publish(self, transfer_id, blocks): ...   # -> address a fetcher passes back
        def fetch(self, address, transfer_id, timeout): ...  # -> KVBlocks, or KVTransferError
        def discard(self, transfer_id): ...
        def close(self): ...

    @hookimpl
    def register_kv_connectors(register):
        register("my-rdma", lambda ctx: MyConnector(ctx.options))

Core's own connector is ``socket`` (length-prefixed frames over a local TCP socket). Test a connector
with ``hetero_core.testing.KVConnectorContract``. Importing this module imports no torch.
"""

from hetero_core.engine.kv.kv_transfer import (
    KVBlocks,
    KVConnector,
    KVConnectorContext,
    KVHandoff,
    KVTensor,
    KVTransferError,
    kv_tensor_from_torch,
    kv_tensor_to_torch,
)

# ``hookimpl`` is ``hetero_core.hookimpl``, kept here for the code that imported it from this facade
from hetero_core.plugin_system.hookspecs import hookimpl as hookimpl

__all__ = [
    "KVBlocks",
    "KVConnector",
    "KVConnectorContext",
    "KVHandoff",
    "KVTensor",
    "KVTransferError",
    "kv_tensor_from_torch",
    "kv_tensor_to_torch",
]
