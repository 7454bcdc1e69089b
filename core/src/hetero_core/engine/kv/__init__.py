"""The KV pool's bookkeeping: the allocator seam and core's allocators, the prefix cache, swap
space, and block copies and transfers between engines."""
