"""``RunnerExecutor``: the executor protocol answered by a ``ModelRunner`` (``self.runner``).

An executor built on core's model code sets ``self.runner`` in its constructor and inherits the
rest, its declaration included (``capabilities``: everything the runner can do); it overrides only
what it adds (the torch executor re-measures its CPU threads before a step).
An executor that sets ``self.graph_runner`` (a ``decode_graphs.DecodeGraphs``, as the triton and
cuda executors do) has every pure decode step that fits a captured size replayed from a CUDA graph.
An executor that can do less sets its own declaration in its constructor: one whose caches cannot be
copied or swapped ``self.capabilities = self.runner_capabilities(block_copy=False, block_swap=False)``
(the engine then falls back as ``engine/kv/block_transfer.py`` describes).
"""

from __future__ import annotations

from functools import cached_property

import torch

from hetero_core.engine.executor_capabilities import ExecutorCapabilities
from hetero_core.engine.kv.kv_transfer import KVTensor, kv_tensor_from_torch, kv_tensor_to_torch
from hetero_core.engine.scheduling.batch import Batch, ExecutorOutput
from hetero_core.model.attention import KVCache
from hetero_core.model.decode_graphs import DecodeGraphs
from hetero_core.model.runner import ModelRunner


class RunnerExecutor:
    runner: ModelRunner
    graph_runner: DecodeGraphs | None = None

    @cached_property
    def capabilities(self) -> ExecutorCapabilities:
        """The declaration, read once (by the builder, after the constructor): ``runner_capabilities()``
        unless the constructor set its own."""
        return self.runner_capabilities()

    def runner_capabilities(self, **declared) -> ExecutorCapabilities:
        """What an executor on ``self.runner`` can do, ``declared`` overriding: the runner returns prompt
        logits and ``1 + n`` rows per speculating sequence (a decode graph runs neither), copies, swaps,
        exports and imports whole blocks (along its cache's block dimension), and its logits rows are
        the model's vocabulary wide."""
        values = dict(
            vocab_size=self.runner.vocab_size,
            supports_prompt_logits=True,
            supports_speculative_decoding=True,
            block_copy=True,
            block_swap=True,
            kv_export=True,
            kv_import=True,
            kv_block_dim=self.runner.kv_cache.block_dim,
        )
        return ExecutorCapabilities(**{**values, **declared})

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
        if (
            self.graph_runner is None
            or batch.prompt_logits is not None
            or not self.graph_runner.can_run(batch)
        ):
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

    def export_blocks(self, block_ids: list[int]) -> list[tuple[KVTensor, ...]]:
        """Whole KV blocks, per layer its K and V (CPU bytes in the cache's layout), for a KV transfer."""
        return [
            tuple(kv_tensor_from_torch(t) for t in layer) for layer in self.runner.export_blocks(block_ids)
        ]

    def import_blocks(self, block_ids: list[int], layers: list[tuple[KVTensor, ...]]) -> None:
        """Write blocks another engine's ``export_blocks`` produced into ``block_ids``."""
        self.runner.import_blocks(
            block_ids, [tuple(kv_tensor_to_torch(t) for t in layer) for layer in layers]
        )

    def shutdown(self) -> None:
        self.graph_runner = None  # the graphs hold memory of their own
        self.runner.shutdown()
