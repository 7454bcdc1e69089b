"""The prefix-cache index: which KV block holds which full block of tokens.

A full block is named by a chained hash of ``(parent block's hash, the block's token ids)``, so a
hash stands for the whole prefix up to and including that block. The index maps hash -> block and
keeps each hashed block's tokens: a lookup compares the tokens too, so a hash collision is a miss,
never wrong K/V. The allocator owns reference counts and eviction; this index only names blocks.
"""

from __future__ import annotations


def block_hash(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """The chained hash of one full block. Python's hash of a tuple of ints is stable across runs."""
    return hash((parent_hash, token_ids))


class PrefixCacheIndex:
    def __init__(self) -> None:
        self._block_of_hash: dict[int, int] = {}
        self._hash_of_block: dict[int, int] = {}
        self._tokens_of_block: dict[int, tuple[int, ...]] = {}

    def __len__(self) -> int:
        """Blocks whose content can be reused (in use or evictable)."""
        return len(self._block_of_hash)

    def find(self, parent_hash: int | None, token_ids: tuple[int, ...]) -> tuple[int, int] | None:
        """``(block, hash)`` of the cached block holding ``token_ids`` after ``parent_hash``, or None."""
        key = block_hash(parent_hash, token_ids)
        block = self._block_of_hash.get(key)
        if block is None or self._tokens_of_block[block] != token_ids:
            return None
        return block, key

    def hash_of(self, block: int) -> int | None:
        return self._hash_of_block.get(block)

    def register(self, block: int, parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
        """Name ``block`` by its content; return its hash. If another block already holds the same
        prefix (computed at the same time), that one stays the cached copy."""
        key = block_hash(parent_hash, token_ids)
        self._hash_of_block[block] = key
        self._tokens_of_block[block] = token_ids
        self._block_of_hash.setdefault(key, block)
        return key

    def is_cached(self, block: int) -> bool:
        """True when a lookup can return ``block``."""
        key = self._hash_of_block.get(block)
        return key is not None and self._block_of_hash.get(key) == block

    def forget(self, block: int) -> None:
        """``block`` is about to hold other tokens: drop its name."""
        key = self._hash_of_block.pop(block, None)
        self._tokens_of_block.pop(block, None)
        if key is not None and self._block_of_hash.get(key) == block:
            del self._block_of_hash[key]
