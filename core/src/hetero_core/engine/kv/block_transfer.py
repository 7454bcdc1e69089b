"""Block transfers between the scheduler and the executor: copy-on-write copies and swap.

They are optional executor methods, each taking ``(source, destination)`` block pairs, that the
executor declares in its ``capabilities`` (``ExecutorCapabilities``): ``copy_blocks`` (device ->
device; ``block_copy``), ``swap_out`` (device -> CPU swap block) and ``swap_in`` (CPU swap block ->
device; ``block_swap``). Before a step's batch runs, the engine applies that step's transfers in this
order: swap out (the freed device blocks may be reused by the batch), swap in, copies.

An executor that does not declare ``block_swap`` makes ``preemption_mode = "swap"`` fall back to
recompute (a warning at start-up says so); one that does not declare ``block_copy`` makes the prefix
cache leave the last token of a fully cached prompt uncached, so no shared block is ever written.
"""

from __future__ import annotations

from hetero_core.logging import get_logger

log = get_logger("hetero.engine")


def can_copy_blocks(executor) -> bool:
    return executor.capabilities.block_copy


def can_swap(executor) -> bool:
    return executor.capabilities.block_swap


def block_transfer_options(executor, executor_name: str, settings) -> dict:
    """Scheduler keyword arguments for what ``executor`` can do with ``settings``' preemption mode."""
    mode = settings.preemption_mode
    if mode == "swap" and not can_swap(executor):
        log.warning(
            "preemption.swap_unsupported",
            executor=executor_name,
            preemption_mode="recompute",
            reason=f"executor '{executor_name}' does not declare block_swap (swap_out/swap_in); "
            "preemption falls back to recompute",
        )
        mode = "recompute"
    return {
        "can_copy_blocks": can_copy_blocks(executor),
        "preemption_mode": mode,
        "num_swap_blocks": settings.num_swap_blocks if mode == "swap" else 0,
    }


def apply_block_transfers(executor, step) -> None:
    """Run ``step``'s swap-outs, swap-ins, KV imports (another engine's blocks, ``kv_transfer.py``)
    and copies on ``executor``, in that order."""
    if step.swap_out:
        executor.swap_out(step.swap_out)
    if step.swap_in:
        executor.swap_in(step.swap_in)
    for blocks, layers in step.kv_imports:
        executor.import_blocks(blocks, layers)
    if step.block_copies:
        executor.copy_blocks(step.block_copies)
