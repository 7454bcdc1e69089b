"""How many KV blocks the pool gets: ``max_num_blocks``, or what a GPU memory share holds.

With ``gpu_memory_utilization`` set, the executor runs a profiling forward after loading the
weights (as vLLM does): one prefill of ``max_num_batched_tokens`` tokens and one decode of
``max_num_seqs`` sequences at the widest block table, on a throw-away cache of a few blocks. Their
peak activation memory is kept free (twice with CUDA graphs: the graphs' pool and the eager steps'
memory are separate), and the rest of the share goes to KV blocks, at most ``max_num_blocks``.
"""

from __future__ import annotations

from hetero_core import ConfigError
from hetero_core.executor import Batch
from hetero_core.logging import get_logger

log = get_logger(__name__)


def bytes_per_block(config, block_size: int, dtype) -> int:
    """K and V of one block in every layer."""
    import torch

    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * block_size * config.num_key_value_heads * config.head_dim * element


def blocks_for_memory_share(executor, share: float, max_blocks: int, *, graphs: bool) -> int:
    import torch

    device = executor.device
    peak = profile_peak_bytes(executor)
    free, total = torch.cuda.mem_get_info(device)
    reserved = peak * (2 if graphs else 1)
    budget = int(share * total) - (total - free) - reserved
    per_block = bytes_per_block(executor.model.config, executor.block_size, executor.dtype)
    fits = budget // per_block - 1  # one block is the scratch block for padded decode rows
    log.info(
        "kv_cache.sized",
        share=share,
        total_gib=round(total / 2**30, 2),
        in_use_gib=round((total - free) / 2**30, 2),
        activations_gib=round(reserved / 2**30, 2),
        blocks_that_fit=fits,
        max_num_blocks=max_blocks,
    )
    if fits < 1:
        raise ConfigError(
            f"executor.cuda.gpu_memory_utilization = {share} leaves no room for KV blocks: "
            f"{(total - free) / 2**30:.2f} GiB of {total / 2**30:.2f} GiB are in use and a step needs "
            f"{reserved / 2**30:.2f} GiB more; raise it, or lower max_total_tokens / max_batch_size"
        )
    return min(fits, max_blocks)


def profile_peak_bytes(executor) -> int:
    """Peak memory of the largest prefill and the largest decode step, beyond what is allocated now."""
    import torch

    from hetero_core.model.runner import ModelRunner

    block_size, width = executor.block_size, executor.max_blocks_per_seq
    num_tokens, num_seqs = executor.max_num_batched_tokens, executor.max_num_seqs
    num_blocks = -(-num_tokens // block_size) + 1
    runner = ModelRunner(
        executor.model,
        num_blocks=num_blocks,
        block_size=block_size,
        dtype=executor.dtype,
        device=executor.device,
    )  # a throw-away cache of a few blocks
    torch.cuda.synchronize(executor.device)
    torch.cuda.reset_peak_memory_stats(executor.device)
    base = torch.cuda.memory_allocated(executor.device)
    with torch.inference_mode():
        for batch in (
            _prefill_batch(num_tokens, num_seqs, executor.max_model_len, block_size),
            _decode_batch(num_seqs, width, block_size),
        ):
            runner.sampled_logits(batch)
    torch.cuda.synchronize(executor.device)
    peak = torch.cuda.max_memory_allocated(executor.device) - base
    runner.kv_cache.free()
    torch.cuda.empty_cache()
    return peak


def _prefill_batch(num_tokens: int, num_seqs: int, max_len: int, block_size: int) -> Batch:
    """Fresh prompts filling ``num_tokens`` (each at most ``max_len``), in consecutive slots."""
    lengths = []
    while sum(lengths) < num_tokens and len(lengths) < num_seqs:
        lengths.append(min(max_len, num_tokens - sum(lengths)))
    tables, starts = [], [0]
    for length in lengths:
        first = starts[-1] // block_size
        tables.append(list(range(first, first + -(-length // block_size))))
        starts.append(starts[-1] + -(-length // block_size) * block_size)
    slots = [s + p for s, length in zip(starts, lengths) for p in range(length)]
    return _batch(
        lengths,
        lengths,
        slots,
        tables,
        block_size,
        positions=[p for length in lengths for p in range(length)],
    )


def _decode_batch(num_seqs: int, width: int, block_size: int) -> Batch:
    """``num_seqs`` decodes at the widest block table, all reading block 0."""
    context = width * block_size
    return _batch(
        [1] * num_seqs,
        [context] * num_seqs,
        [0] * num_seqs,
        [[0] * width] * num_seqs,
        block_size,
        positions=[context - 1] * num_seqs,
    )


def _batch(query_lens, context_lens, slots, tables, block_size, positions) -> Batch:
    starts = [0]
    for length in query_lens:
        starts.append(starts[-1] + length)
    n = len(query_lens)
    return Batch(
        seq_ids=list(range(n)),
        token_ids=[0] * starts[-1],
        positions=positions,
        slot_mapping=slots,
        query_start_loc=starts,
        context_lens=list(context_lens),
        block_tables=[list(t) for t in tables],
        is_prefill=[q > 1 for q in query_lens],
        sample=[True] * n,
        num_prompt_tokens=list(context_lens),
        seeds=[None] * n,
        block_size=block_size,
    )
