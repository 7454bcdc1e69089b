"""NullExecutor: an executor that does no per-token work, for measuring the engine's own time per step.

It keeps no cache and reads nothing but the batch's lengths: each sampled row gets a token derived
from its sequence id and position (deterministic, batch-independent), computed in one pass over the
rows. Block copies and swaps are accepted and do nothing, so every engine path (prefix caching with
copy-on-write, swap preemption) runs. ``step_time`` sleeps a fixed time per step instead, the model of
a GPU whose step takes that long while the host waits (for ``hetero bench host-overhead --overlap``).
"""

from __future__ import annotations

import time

from hetero_core import ConfigError
from hetero_core.executor import Batch, ExecutorCapabilities, ExecutorContext, ExecutorOutput
from hetero_plugins_mock.options import NullExecutorOptions


class NullExecutor:
    def __init__(self, ctx: ExecutorContext) -> None:
        self.options: NullExecutorOptions = ctx.options or NullExecutorOptions()
        if self.options.vocab_size > ctx.vocab_size:
            raise ConfigError(
                f"executor.null.vocab_size ({self.options.vocab_size}) exceeds the tokenizer's "
                f"vocabulary ({ctx.vocab_size})"
            )
        self.eos_token_id = None  # never emits EOS: requests end by length or stop strings
        self.capabilities = ExecutorCapabilities(  # copies and swaps are accepted and do nothing
            block_copy=True, block_swap=True, prefers_async_scheduling=self.options.step_time > 0
        )  # a device to overlap with: worth a thread
        self._first = self.options.first_token_id
        self._span = self.options.vocab_size - self.options.first_token_id

    def execute(self, batch: Batch) -> ExecutorOutput:
        first, span = self._first, self._span
        seq_ids, context_lens = batch.seq_ids, batch.context_lens
        token_ids = [first + (seq_ids[i] * 7919 + context_lens[i]) % span for i in batch.sample_indices]
        if self.options.step_time:
            time.sleep(self.options.step_time)
        return ExecutorOutput(token_ids=token_ids)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        pass

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        pass

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        pass

    def shutdown(self) -> None:
        pass
