"""Decode steps replayed from CUDA graphs, padded up to the next captured batch size.

A graph replays fixed kernels on fixed addresses, so the runner owns static input buffers sized
for the largest captured batch (token ids, positions, slot mapping, cache lengths, and a block
table as wide as ``max_model_len`` needs) and captures one graph per batch size over slices of
them, largest first, all sharing one memory pool. A step with ``n`` sequences runs the graph of
the smallest captured size ``>= n``: its rows are copied in, and the padding rows read and write
only the scratch block (the KV pool's extra last block, never handed to a sequence) with a
context of one token, so they cannot touch a real sequence's cache.

On a device without CUDA graphs (the CPU, with a test double of flash-attn) the same padded,
static-buffer path runs eagerly, so the padding logic is exercised everywhere.
"""

from __future__ import annotations

import bisect

import torch

from hetero_core.executor import Batch
from hetero_core.logging import get_logger
from hetero_plugins_cuda.attention import DecodeMetadata, FlashAttnMetadata, block_table_tensor, check_block_tables

log = get_logger(__name__)


def default_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 16, up to ``max_num_seqs`` (always included)."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_num_seqs] + list(range(16, max_num_seqs, 16))
    return sizes + [max_num_seqs]


class DecodeGraphRunner:
    def __init__(self, model, kv_caches, *, batch_sizes: list[int], max_blocks_per_seq: int,
                 scratch_block: int, block_size: int, device: torch.device):
        self.model = model
        self.kv_caches = kv_caches
        self.batch_sizes = sorted(batch_sizes)
        self.max_blocks_per_seq = max_blocks_per_seq
        self.scratch_block = scratch_block
        self.block_size = block_size
        self.device = device
        self.is_captured = device.type == "cuda"
        size = self.batch_sizes[-1]
        self.input_ids = torch.zeros(size, dtype=torch.long, device=device)
        self.positions = torch.zeros(size, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((size,), scratch_block * block_size, dtype=torch.long, device=device)
        self.cache_seqlens = torch.ones(size, dtype=torch.int32, device=device)
        self.block_table = torch.full((size, max_blocks_per_seq), scratch_block, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def padded_size(self, num_seqs: int) -> int | None:
        """The smallest captured batch size that holds ``num_seqs`` sequences (None: none does)."""
        index = bisect.bisect_left(self.batch_sizes, num_seqs)
        return self.batch_sizes[index] if index < len(self.batch_sizes) else None

    def can_run(self, batch: Batch) -> bool:
        """A pure decode step that fits a captured size and the static block table."""
        return (
            batch.num_tokens == batch.num_seqs
            and self.padded_size(batch.num_seqs) is not None
            and max(len(t) for t in batch.block_tables) <= self.max_blocks_per_seq
        )

    def capture(self) -> None:
        """Capture one graph per batch size (CUDA only; elsewhere the steps run eagerly)."""
        if not self.is_captured:
            log.info("cuda_graphs.emulated", device=str(self.device), batch_sizes=self.batch_sizes)
            return
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.batch_sizes):
            self._forward(size)  # warm-up outside the graph (allocator, lazy kernel loading)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._forward(size)
            self.graphs[size] = graph
        torch.cuda.synchronize(self.device)
        log.info("cuda_graphs.captured", batch_sizes=self.batch_sizes)

    def run(self, batch: Batch) -> torch.Tensor:
        """Logits ``[num_seqs, vocab]`` (on the device, model dtype) of a step ``can_run`` accepted."""
        check_block_tables(batch)
        num_seqs, size = batch.num_seqs, self.padded_size(batch.num_seqs)
        padding = size - num_seqs
        scratch_slot = self.scratch_block * self.block_size
        tables = batch.block_tables + [[self.scratch_block]] * padding
        rows = torch.tensor(
            [batch.token_ids + [0] * padding,
             batch.positions + [0] * padding,
             batch.slot_mapping + [scratch_slot] * padding,
             batch.context_lens + [1] * padding],
            dtype=torch.long,
        )  # fmt: skip
        self.input_ids[:size].copy_(rows[0], non_blocking=True)
        self.positions[:size].copy_(rows[1], non_blocking=True)
        self.slot_mapping[:size].copy_(rows[2], non_blocking=True)
        self.cache_seqlens[:size].copy_(rows[3], non_blocking=True)
        self.block_table[:size].copy_(block_table_tensor(tables, self.max_blocks_per_seq), non_blocking=True)
        if self.is_captured:
            self.graphs[size].replay()
            logits = self.outputs[size]
        else:
            logits = self._forward(size)
        return logits[:num_seqs]

    def _forward(self, size: int) -> torch.Tensor:
        metadata = FlashAttnMetadata(
            slot_mapping=self.slot_mapping[:size],
            decode=DecodeMetadata(block_table=self.block_table[:size], cache_seqlens=self.cache_seqlens[:size]),
            prefill=None,
        )
        hidden = self.model(self.input_ids[:size], self.positions[:size], metadata, self.kv_caches)
        return self.model.compute_logits(hidden)
