"""Preemption: making room when the KV pool runs out, by recompute or by swap.

- ``recompute``: the victim's blocks are freed (full ones stay in the prefix cache) and it waits to be
  prefilled again, prompt and generated tokens together.
- ``swap``: the victim's blocks are copied to the CPU swap space (``num_swap_blocks``) and it keeps its
  computed tokens; it comes back (blocks copied in) before new requests are admitted. A victim that
  does not fit in the swap space falls back to recompute.

Either way its sampled tokens are kept, so it finishes with the tokens it would have produced without
preemption. This module only decides: ``choose_victim`` names the sequence to preempt and
``Preemptor.preempt`` says how (the swap pairs, or none for recompute); the scheduler applies that to
its own queues, logs it (``request.preempted``) and counts it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hetero_core.engine.kv.swap import SwapSpace
from hetero_core.engine.requests.sequence import Sequence

PREEMPTION_MODES = ("recompute", "swap")


@dataclass(frozen=True)
class Preemption:
    """How one victim is preempted."""

    mode: str  # "swap" or "recompute"
    num_blocks: int  # device blocks holding its computed K/V
    swap_table: list[int]  # the swap blocks that will hold them (empty for recompute)
    swap_out: list[tuple[int, int]]  # (device block, swap block) to copy before the blocks are reused


def choose_victim(running: Iterable[Sequence], scheduled_ids: set[int]) -> Sequence:
    """The running sequence, not scheduled yet this step, that the policy ranks last (``seq.rank``)."""
    return max((s for s in running if s.seq_id not in scheduled_ids), key=lambda s: s.rank)


class Preemptor:
    """The preemption mode and, for ``swap``, the CPU swap space's block ids."""

    def __init__(self, mode: str, num_swap_blocks: int) -> None:
        if mode not in PREEMPTION_MODES:
            raise ValueError(
                f"unknown preemption_mode {mode!r}; valid options are: {', '.join(PREEMPTION_MODES)}"
            )
        self.mode = mode
        self.swap_space = SwapSpace(num_swap_blocks) if mode == "swap" else None

    def preempt(self, seq: Sequence, allocator) -> Preemption:
        """How to preempt ``seq``: swap its computed blocks out when the swap space has room (the swap
        blocks are taken for it), else recompute. Changes nothing else: the scheduler applies it."""
        # Blocks that hold computed K/V (a contiguous reservation also holds empty ones, not copied)
        device_blocks = seq.block_table[: allocator.num_blocks_for(seq.num_computed_tokens)]
        space = self.swap_space
        if space is None or not seq.num_computed_tokens or len(device_blocks) > space.num_free_blocks:
            return Preemption("recompute", len(device_blocks), [], [])
        swap_table = space.allocate(len(device_blocks))
        return Preemption("swap", len(device_blocks), swap_table, list(zip(device_blocks, swap_table)))

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        """The ``(swap block, device block)`` pairs that bring a swapped ``seq`` back into its new
        block table; its swap blocks are free again."""
        pairs = list(zip(seq.swap_table, seq.block_table))
        self.swap_space.free(seq.swap_table)
        return pairs

    def release(self, seq: Sequence) -> None:
        """Free the swap blocks of a sequence that leaves while swapped."""
        if seq.swap_table:
            self.swap_space.free(seq.swap_table)
