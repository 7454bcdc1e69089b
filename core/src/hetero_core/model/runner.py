"""``ModelRunner``: a loaded model and its paged KV cache, run one engine step at a time.

What every executor built on core's model code shares, whatever its attention backend: the torch
executor (the CPU runtime around it), the Triton executor (its kernels as the backend) and the cuda
executor (flash-attn, with CUDA graphs for decode steps) each hold one and add only their own
concerns. Per step it builds the token ids, positions and the backend's metadata once, runs the
model under ``torch.inference_mode()`` and returns fp32 logits, on the model's device, for the
sampled rows in ``batch.sample_indices`` order (the sampler runs where they are: no copy of
``[rows, vocab]`` logits to the host each step on a GPU).

A step's inputs reach the device in one copy (``step_inputs``): the runner adds the token ids,
positions and sampled rows, the backend adds its metadata's arrays and uploads them all. Nothing in
a step waits for the device: no pageable copies, no ``.item()``; the rotary frequencies live on the
model's device.

Speculative decoding (``batch.num_spec_tokens``): a sampled sequence's last ``1 + n`` rows all go
through the head (the same extra-rows path), so verification gets every proposal's logits.

Prompt logprobs (``batch.prompt_logits``): the rows of the flagged sequences' segments go through
the last layer and the head with the sampled rows, in one pass; ``ExecutorOutput.prompt_logits``
gets them, one fp32 ``[query_len, vocab]`` tensor per flagged sequence.
"""

from __future__ import annotations

import numpy as np
import torch

from hetero_core.engine.scheduling.batch import Batch, ExecutorOutput
from hetero_core.model.attention import KVCache
from hetero_core.model.causal_lm import CausalLM
from hetero_core.model.paged_kv_cache import PagedKVCache
from hetero_core.model.step_inputs import StepInputs


class ModelRunner:
    """``model`` (built with its attention backend, e.g. by ``loader.load_model``) over a paged KV
    cache of ``num_blocks`` blocks of ``block_size`` tokens in ``dtype`` on ``device``, with
    ``num_swap_blocks`` CPU blocks of swap space. Implements the executor protocol's steps:
    ``execute``, ``copy_blocks``, ``swap_out``, ``swap_in``, ``export_blocks``, ``import_blocks``,
    ``shutdown``, ``vocab_size``, ``eos_token_id``."""

    # It returns ExecutorOutput.prompt_logits for batch.prompt_logits and 1 + n rows per sampled sequence
    # with batch.num_spec_tokens: ``RunnerExecutor.runner_capabilities`` declares both for its executor.

    def __init__(
        self,
        model: CausalLM,
        *,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        num_swap_blocks: int = 0,
    ):
        self.model = model
        self.backend = model.backend
        self.block_size = block_size
        self.dtype = dtype
        self.device = device
        self.kv_cache = PagedKVCache(
            self.backend,
            model.config,
            num_blocks=num_blocks,
            block_size=block_size,
            dtype=dtype,
            device=device,
            num_swap_blocks=num_swap_blocks,
        )
        self.inputs = StepInputs(device)
        rotary = getattr(model, "rotary", None)
        if rotary is not None:
            rotary.inv_freq = rotary.inv_freq.to(device)  # no host copy per step (nor inside a CUDA graph)

    @property
    def kv_caches(self) -> list[KVCache]:
        """One ``KVCache`` per decoder layer, in the backend's layout."""
        return self.kv_cache.layers

    @property
    def vocab_size(self) -> int:
        """Width of the logits rows (the model's vocabulary, which may exceed the tokenizer's)."""
        return self.model.config.vocab_size

    @property
    def eos_token_id(self) -> int | None:
        return self.model.config.eos_token_id

    def execute(self, batch: Batch) -> ExecutorOutput:
        """One step: fp32 logits rows (on the device) of ``batch``'s sampled sequences."""
        self.check_block_size(batch)
        with torch.inference_mode():
            if batch.prompt_logits is None:
                return ExecutorOutput(logits=self.sampled_logits(batch).float())
            prompt_rows = batch_prompt_rows(batch)
            logits = self.sampled_logits(batch, prompt_rows).float()
            num_sampled = batch.num_sampled_rows
            sizes = [batch.query_len(i) for i in batch.prompt_logits_indices]
            return ExecutorOutput(
                logits=logits[:num_sampled], prompt_logits=list(torch.split(logits[num_sampled:], sizes))
            )

    def sampled_logits(self, batch: Batch, extra_rows: np.ndarray | None = None) -> torch.Tensor:
        """The model over ``batch`` (its K/V written to the cache): logits of the sampled rows in
        the model's dtype, then of ``extra_rows`` (flat rows, e.g. prompt rows). Call it under
        ``torch.inference_mode()``."""
        upload = self.inputs.begin()
        input_ids = upload.add(batch.token_ids, torch.long)
        positions = upload.add(batch.positions, torch.long)
        rows = sampled_rows(batch)
        if extra_rows is not None:
            first = np.arange(batch.num_tokens, dtype=np.int64) if rows is None else rows
            rows = np.concatenate([first, extra_rows])
        staged_rows = None if rows is None else upload.add(rows, torch.long)
        metadata = self.backend.build_metadata(batch, self.device, upload)  # uploads everything
        if not upload.is_uploaded:
            upload.upload()
        return self.model.sampled_logits(
            input_ids.tensor,
            positions.tensor,
            metadata,
            self.kv_caches,
            None if staged_rows is None else staged_rows.tensor,
        )

    def check_block_size(self, batch: Batch) -> None:
        if batch.block_size != self.block_size:
            raise ValueError(f"batch block_size {batch.block_size} != executor block_size {self.block_size}")

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks within the cache (copy-on-write): ``(source, destination)`` pairs."""
        self.kv_cache.copy_blocks(pairs)

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Copy KV blocks to the CPU swap space: ``(device block, swap block)`` pairs."""
        self.kv_cache.swap_out(pairs)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """Copy KV blocks back from the CPU swap space: ``(swap block, device block)`` pairs."""
        self.kv_cache.swap_in(pairs)

    def export_blocks(self, block_ids: list[int]) -> list[tuple[torch.Tensor, ...]]:
        """CPU copies of whole KV blocks, per layer (``PagedKVCache.export_blocks``)."""
        return self.kv_cache.export_blocks(block_ids)

    def import_blocks(self, block_ids: list[int], layers: list[tuple[torch.Tensor, ...]]) -> None:
        """Write exported KV blocks into ``block_ids`` (``PagedKVCache.import_blocks``)."""
        self.kv_cache.import_blocks(block_ids, layers)

    def shutdown(self) -> None:
        """Free the cache and the model (and the CUDA allocator's cached blocks)."""
        self.kv_cache.free()
        self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def batch_prompt_rows(batch: Batch) -> np.ndarray:
    """The flat rows of the sequences flagged in ``batch.prompt_logits``, in order."""
    starts = batch.query_start_loc
    spans = [np.arange(starts[i], starts[i + 1], dtype=np.int64) for i in batch.prompt_logits_indices]
    return np.concatenate(spans) if spans else np.zeros(0, dtype=np.int64)


def sampled_rows(batch: Batch) -> np.ndarray | None:
    """The flat rows whose logits are sampled (each sampled sequence's last token, or with
    ``batch.num_spec_tokens`` its last ``1 + n``), in order; None when that is every row in order
    (a decode step)."""
    if batch.num_tokens == batch.num_seqs and all(batch.sample):
        return None
    ends = np.asarray(batch.query_start_loc[1:], dtype=np.int64)
    if batch.num_spec_tokens is None:
        return ends[np.asarray(batch.sample, dtype=bool)] - 1
    spans = [
        np.arange(end - 1 - n, end, dtype=np.int64)
        for end, flag, n in zip(ends.tolist(), batch.sample, batch.num_spec_tokens)
        if flag
    ]
    return np.concatenate(spans) if spans else np.zeros(0, dtype=np.int64)
