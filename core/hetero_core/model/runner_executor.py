"""``RunnerExecutor``: the executor protocol answered by a ``ModelRunner`` (``self.runner``).

An executor built on core's model code sets ``self.runner`` in its constructor and inherits the
rest; it overrides only what it adds (the torch executor re-measures its CPU threads before a step).
An executor that sets ``self.graph_runner`` (a ``decode_graphs.DecodeGraphs``, as the triton and
cuda executors do) has every pure decode step that fits a captured size replayed from a CUDA graph.
An executor whose caches cannot be copied or swapped sets ``copy_blocks = swap_out = swap_in = None``:
the engine then falls back as ``engine/block_transfer.py`` describes.
"""

from __future__ import annotations

import torch

from hetero_core.engine.batch import Batch, ExecutorOutput
from hetero_core.model.attention import KVCache
from hetero_core.model.decode_graphs import DecodeGraphs
from hetero_core.model.runner import ModelRunner


class RunnerExecutor:
    runner: ModelRunner
    graph_runner: DecodeGraphs | None = None
    supports_prompt_logits = True  # the runner returns ExecutorOutput.prompt_logits (never a decode graph)
    supports_speculative_decoding = True  # the runner returns 1 + n rows per speculating sequence (never a graph)

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
        if self.graph_runner is None or batch.prompt_logits is not None or not self.graph_runner.can_run(batch):
            return self.runner.execute(batch)
        self.runner.check_block_size(batch)
        with torch.inference_mode():
            return ExecutorOutput(logits=self.graph_runner.run(batch))

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
        self.graph_runner = None  # the graphs hold memory of their own
        self.runner.shutdown()
