"""``RunnerExecutor``: the executor protocol answered by a ``ModelRunner`` (``self.runner``).

An executor built on core's model code sets ``self.runner`` in its constructor and inherits the
rest; it overrides only what it adds (the torch executor re-measures its CPU threads before a step,
the cuda executor replays decode steps from CUDA graphs). An executor whose caches cannot be
copied or swapped sets ``copy_blocks = swap_out = swap_in = None``: the engine then falls back as
``engine/block_transfer.py`` describes.
"""

from __future__ import annotations

from hetero_core.engine.batch import Batch, ExecutorOutput
from hetero_core.model.attention import KVCache
from hetero_core.model.runner import ModelRunner


class RunnerExecutor:
    runner: ModelRunner

    @property
    def vocab_size(self) -> int:
        """Width of the logits rows (the model's vocabulary, which may exceed the tokenizer's)."""
        return self.runner.vocab_size

    @property
    def eos_token_id(self) -> int | None:
        return self.runner.eos_token_id

    @property
    def kv_caches(self) -> list[KVCache]:
        return self.runner.kv_caches

    def execute(self, batch: Batch) -> ExecutorOutput:
        return self.runner.execute(batch)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks within the cache (copy-on-write): ``(source, destination)`` pairs."""
        self.runner.copy_blocks(pairs)

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Copy KV blocks to the CPU swap space: ``(device block, swap block)`` pairs."""
        self.runner.swap_out(pairs)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """Copy KV blocks back from the CPU swap space: ``(swap block, device block)`` pairs."""
        self.runner.swap_in(pairs)

    def shutdown(self) -> None:
        self.runner.shutdown()
