"""Pure decode steps replayed from CUDA graphs, padded up to the next captured batch size.

A graph replays fixed kernels on fixed addresses, so the runner owns one static input buffer on the
device, sized for the largest captured batch, and captures one graph per batch size over views of
it (token ids, positions, slot mapping, context lengths, a block table as wide as the longest
context needs, the sampled rows), largest first, all sharing one memory pool: the whole decode
forward, every layer and the LM head. A step with ``n`` sequences runs the graph of the smallest
captured size ``>= n``: its arrays are written into a pinned host buffer laid out exactly like that
size's views and copied in one host-to-device copy, then the graph replays. Padding rows read and
write only the scratch block (a KV block the pool never hands out) with a context of one token,
so they cannot touch a real sequence's cache.

The backend builds its metadata over the static views once per size
(``backend.decode_graph_metadata(DecodeGraphInputs)``); a backend without that method gets no
graphs. Capture that fails (an operation that cannot be captured) is logged and the executor runs
every step eagerly. On a device without CUDA graphs (the CPU, with a test double of a GPU kernel)
the same padded, static-buffer path runs eagerly, so the padding logic is exercised everywhere.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
import torch

from hetero_core.engine.scheduling.batch import Batch
from hetero_core.logging import get_logger
from hetero_core.model.step_inputs import StepInputs, StepUpload, fill_block_tables, packed_size, packed_views

log = get_logger(__name__)


def default_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 16, up to ``max_num_seqs`` (always included)."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_num_seqs] + list(range(16, max_num_seqs, 16))
    return sizes + [max_num_seqs]


@dataclass(frozen=True)
class DecodeGraphInputs:
    """One captured batch size's static inputs, which a backend builds its decode metadata from."""

    num_seqs: int  # the padded batch size
    max_context_len: int  # the longest context a sequence can have (the block table's width in tokens)
    block_size: int  # tokens per KV block
    slot_mapping: torch.Tensor  # int64 [num_seqs]
    context_lens: torch.Tensor  # int32 [num_seqs] tokens in the cache, this step's included
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq], padded with block 0
    query_rows: torch.Tensor  # int32 [num_seqs] the flat row of each sequence's token: 0, 1, 2, ...


# The static arrays of a size, in buffer order: (name, dtype, columns); columns None: one per sequence.
LAYOUT = (
    ("input_ids", torch.long, None),
    ("positions", torch.long, None),
    ("slot_mapping", torch.long, None),
    ("sampled_rows", torch.long, None),
    ("context_lens", torch.int32, None),
    ("block_tables", torch.int32, "width"),
)


def build_decode_graphs(
    runner, *, scratch_block: int, max_num_seqs: int, max_model_len: int, batch_sizes: list[int] | None = None
) -> DecodeGraphs | None:
    """Decode graphs over ``runner``'s model and cache (``runner.kv_cache`` holds ``scratch_block``,
    a block the pool never hands out), captured on a CUDA device (emulated elsewhere); None for a
    model whose forward waits on the device (``captures_in_cuda_graphs = False``: a mixture of
    experts reads its experts' token counts each layer), which then runs every step eagerly."""
    if not getattr(runner.model, "captures_in_cuda_graphs", True):
        return None
    graphs = DecodeGraphs(
        runner.model, runner.kv_caches, batch_sizes=batch_sizes or default_batch_sizes(max_num_seqs),
        max_blocks_per_seq=-(-max_model_len // runner.block_size), scratch_block=scratch_block,
        block_size=runner.block_size, device=runner.device,
    )  # fmt: skip
    with torch.inference_mode():
        graphs.capture()
    return graphs


class DecodeGraphs:
    """Decode graphs of ``model`` (its ``backend`` has ``decode_graph_metadata``) over ``kv_caches``."""

    def __init__(
        self,
        model,
        kv_caches,
        *,
        batch_sizes: list[int],
        max_blocks_per_seq: int,
        scratch_block: int,
        block_size: int,
        device: torch.device,
    ):
        self.model = model
        self.kv_caches = kv_caches
        self.batch_sizes = sorted(batch_sizes)
        self.max_blocks_per_seq = max_blocks_per_seq
        self.scratch_block = scratch_block
        self.block_size = block_size
        self.device = device
        self.is_captured = False
        self.inputs = StepInputs(device)
        largest = self.batch_sizes[-1]
        self.static = torch.zeros(packed_size(self._shapes(largest)), dtype=torch.uint8, device=device)
        self.query_rows = torch.arange(largest, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def padded_size(self, num_seqs: int) -> int | None:
        """The smallest captured batch size that holds ``num_seqs`` sequences (None: none does)."""
        index = bisect.bisect_left(self.batch_sizes, num_seqs)
        return self.batch_sizes[index] if index < len(self.batch_sizes) else None

    def can_run(self, batch: Batch) -> bool:
        """A pure decode step that fits a captured size and the static block table."""
        return (
            batch.num_tokens == batch.num_seqs > 0
            and self.padded_size(batch.num_seqs) is not None
            and max(map(len, batch.block_tables)) <= self.max_blocks_per_seq
        )

    def capture(self) -> None:
        """Capture one graph per batch size (CUDA only; elsewhere the steps run eagerly). A capture
        that fails is logged and leaves every step eager."""
        if self.device.type != "cuda":
            log.info("cuda_graphs.emulated", device=str(self.device), batch_sizes=self.batch_sizes)
            return
        pool = torch.cuda.graph_pool_handle()
        try:
            for size in reversed(self.batch_sizes):
                self._stage(size, None).upload(into=self.static)  # every row padding
                self._forward(size)  # warm-up outside the graph (allocator, kernel compilation)
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[size] = self._forward(size)
                self.graphs[size] = graph
        except Exception as exc:  # noqa: BLE001 - any failure leaves eager mode, which is always correct
            self.graphs, self.outputs = {}, {}
            torch.cuda.synchronize(self.device)
            log.warning(
                "cuda_graphs.capture_failed",
                error=f"{type(exc).__name__}: {exc}",
                action="every step runs eagerly",
            )
            return
        torch.cuda.synchronize(self.device)
        self.is_captured = True
        log.info("cuda_graphs.captured", batch_sizes=self.batch_sizes)

    def run(self, batch: Batch) -> torch.Tensor:
        """Logits ``[sampled rows, vocab]`` (fp32, fresh memory, on the device) of a step ``can_run``
        accepted; every step's inputs reach the device in one copy."""
        size = self.padded_size(batch.num_seqs)
        upload = self._stage(size, batch)
        upload.upload(into=self.static)
        if self.is_captured:
            self.graphs[size].replay()
            logits = self.outputs[size]
        else:
            logits = self._forward(size)
        num_sampled = sum(batch.sample)
        if num_sampled != batch.num_seqs:
            rows = self._views(size)["sampled_rows"][:num_sampled]
            return logits.index_select(0, rows).float()
        return logits[: batch.num_seqs].to(torch.float32, copy=True)  # the graph's output is reused

    def _stage(self, size: int, batch: Batch | None) -> StepUpload:
        """Size ``size``'s arrays for ``batch`` (None: padding only), in ``LAYOUT`` order."""
        n = 0 if batch is None else batch.num_seqs
        upload = self.inputs.begin()

        def column(values, fill: int, dtype: torch.dtype) -> None:
            array = np.full(size, fill, dtype=np.int64 if dtype == torch.long else np.int32)
            if n:
                array[: len(values)] = values
            upload.add(array, dtype)

        empty = []
        column(batch.token_ids if n else empty, 0, torch.long)
        column(batch.positions if n else empty, 0, torch.long)
        column(batch.slot_mapping if n else empty, self.scratch_block * self.block_size, torch.long)
        column(np.flatnonzero(np.asarray(batch.sample, dtype=bool)) if n else empty, 0, torch.long)
        column(batch.context_lens if n else empty, 1, torch.int32)
        tables = upload.zeros((size, self.max_blocks_per_seq), torch.int32)
        if n:
            fill_block_tables(tables.host[:n], batch.block_tables)
        tables.host[n:, 0] = self.scratch_block
        return upload

    def _shapes(self, size: int) -> list[tuple[tuple[int, ...], torch.dtype]]:
        return [
            ((size, self.max_blocks_per_seq) if columns else (size,), dtype) for _, dtype, columns in LAYOUT
        ]

    def _views(self, size: int) -> dict[str, torch.Tensor]:
        views = packed_views(self.static, self._shapes(size))
        return {name: view for (name, _, _), view in zip(LAYOUT, views)}

    def _forward(self, size: int) -> torch.Tensor:
        views = self._views(size)
        inputs = DecodeGraphInputs(
            num_seqs=size, max_context_len=self.max_blocks_per_seq * self.block_size,
            block_size=self.block_size, slot_mapping=views["slot_mapping"],
            context_lens=views["context_lens"], block_tables=views["block_tables"],
            query_rows=self.query_rows[:size],
        )  # fmt: skip
        metadata = self.model.backend.decode_graph_metadata(inputs)
        hidden = self.model(views["input_ids"], views["positions"], metadata, self.kv_caches)
        return self.model.compute_logits(hidden)
