"""What a KV-allocator author imports: the allocator protocol, its block and result types, core's two
allocators (to read or wrap). See docs/hooks.md ("register_kv_allocators").

    from hetero_core import hookimpl
    from hetero_core.kv import NO_BLOCK_COPIES, NoPrefixCache

    class OneBlockEach(NoPrefixCache):   # a KVAllocator without a prefix cache
        ...

    @hookimpl
    def register_kv_allocators(register):
        register(
            "one-block-each",
            lambda num_blocks, block_size, options: OneBlockEach(num_blocks, block_size),
        )

Test it with ``hetero_core.testing.kv_allocator_contract.KVAllocatorContract``. Importing this module
imports no torch.
"""

from hetero_core.engine.kv.block_allocator import PagedBlockAllocator
from hetero_core.engine.kv.contiguous_allocator import ContiguousBlockAllocator
from hetero_core.engine.kv.kv_allocator import (
    NO_BLOCK_COPIES,
    NO_COMPUTED_BLOCKS,
    BlockAllocatorError,
    ComputedBlocks,
    KVAllocator,
    NoPrefixCache,
    SlotAllocation,
)

# ``hookimpl`` is ``hetero_core.hookimpl``, kept here for the code that imported it from this facade
from hetero_core.plugin_system.hookspecs import hookimpl as hookimpl

__all__ = [
    "NO_BLOCK_COPIES",
    "NO_COMPUTED_BLOCKS",
    "BlockAllocatorError",
    "ComputedBlocks",
    "ContiguousBlockAllocator",
    "KVAllocator",
    "NoPrefixCache",
    "PagedBlockAllocator",
    "SlotAllocation",
]
