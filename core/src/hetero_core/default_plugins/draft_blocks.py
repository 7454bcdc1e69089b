"""The draft proposer's own KV pool: a free list of blocks, and per sequence its blocks and the token ids
whose K/V they hold (position ``i`` of the list is the token at position ``i``)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class DraftSequence:
    blocks: list[int] = field(default_factory=list)
    token_ids: list[int] = field(
        default_factory=list
    )  # tokens whose K/V the draft cache holds, from position 0


class DraftBlockPool:
    """``num_blocks`` blocks of ``block_size`` tokens shared by the proposer's sequences."""

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self.sequences: dict[int, DraftSequence] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def sequence(self, seq_id: int) -> DraftSequence:
        return self.sequences.setdefault(seq_id, DraftSequence())

    def reserve(self, seq_id: int, num_tokens: int) -> bool:
        """Give ``seq_id`` blocks for ``num_tokens`` positions; all or nothing (False: too few free)."""
        seq = self.sequence(seq_id)
        missing = -(-num_tokens // self.block_size) - len(seq.blocks)
        if missing > len(self._free):
            return False
        seq.blocks.extend(self._free.popleft() for _ in range(max(missing, 0)))
        return True

    def release(self, seq_id: int) -> None:
        """Return ``seq_id``'s blocks to the pool and forget its tokens (unknown ids: nothing to do)."""
        seq = self.sequences.pop(seq_id, None)
        if seq is not None:
            self._free.extend(seq.blocks)


def common_prefix(cached: list[int], token_ids: list[int]) -> int:
    """How many leading tokens ``cached`` and ``token_ids`` share."""
    n = min(len(cached), len(token_ids))
    for i in range(n):
        if cached[i] != token_ids[i]:
            return i
    return n
