"""Timed steps of a loaded model, for ``dtype_choice``: a prefill, a batched decode and a single
decode, run through the model's ``ModelRunner`` exactly as the engine runs them (packed linears,
kernels, fused decode), on a KV cache of their own.

The steps' tokens are fixed (token 1 everywhere; the work does not depend on the values) and the
cache is zeroed first (its garbage could hold NaNs or denormals, which would time differently).
Decodes attend a ``CONTEXT``-token context that no prefill wrote: its zeros cost the same as real keys.
"""

from __future__ import annotations

import time

from hetero_core.engine.scheduling.batch import Batch
from hetero_core.model.cpu.dtype_choice import (
    CONTEXT,
    DECODE_SEQS,
    PREFILL_TOKENS,
    REPEATS,
    Outpaced,
    StepTimes,
)

BLOCK_SIZE = 16
STEP_BUDGET_S = 0.3  # a step is timed again only while its timings add up to less
PROMPT = 64  # tokens per prefilled prompt (PREFILL_TOKENS / PROMPT prompts in the step)


def num_blocks() -> int:
    """KV blocks the probe's runner needs: every decoding sequence's context and its new token."""
    return DECODE_SEQS * ((max(CONTEXT, PROMPT) + 1 + BLOCK_SIZE - 1) // BLOCK_SIZE)


def time_steps(runner, ceiling_s: float | None = None) -> StepTimes:
    """The best of up to ``REPEATS`` timings (after one warm-up) of each probe step on ``runner`` (a
    ``ModelRunner`` with ``num_blocks()`` blocks of ``BLOCK_SIZE``); a step stops repeating once its
    timings add up to ``STEP_BUDGET_S`` (a long step's spread is a small part of it, and repeating it
    was most of a first start's probe: a 1B model's 128-token prefill takes ~1 s in fp32). ``ceiling_s``:
    ``Outpaced`` (with the first timed round's figures, of this runner's model) where that round's
    reference workload is above it."""
    for cache in runner.kv_caches:
        cache.key.zero_()
        cache.value.zero_()
    steps = (prefill_batch(PREFILL_TOKENS // PROMPT), decode_batch(DECODE_SEQS), decode_batch(1))
    best = [float("inf")] * len(steps)
    spent = [0.0] * len(steps)
    for repeat in range(REPEATS + 1):
        for index, batch in enumerate(steps):
            if repeat > 1 and spent[index] >= STEP_BUDGET_S:
                continue
            start = time.perf_counter()
            runner.execute(batch)
            elapsed = time.perf_counter() - start
            if repeat:  # the first round warms up (oneDNN's kernels, the page cache, the allocator)
                best[index] = min(best[index], elapsed)
                spent[index] += elapsed
        if repeat == 1 and ceiling_s is not None and StepTimes(*best).workload_s() > ceiling_s:
            raise Outpaced(StepTimes(*best))
    return StepTimes(*best)


def _blocks(seq: int) -> list[int]:
    per_seq = num_blocks() // DECODE_SEQS
    return list(range(seq * per_seq, (seq + 1) * per_seq))


def prefill_batch(num_prompts: int) -> Batch:
    """``num_prompts`` prompts of ``PROMPT`` tokens, from position 0."""
    token_ids, positions, slots, starts = [], [], [], [0]
    for seq in range(num_prompts):
        table = _blocks(seq)
        for position in range(PROMPT):
            token_ids.append(1)
            positions.append(position)
            slots.append(table[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE)
        starts.append(len(token_ids))
    return _batch(num_prompts, token_ids, positions, slots, starts, [PROMPT] * num_prompts, prefill=True)


def decode_batch(num_seqs: int) -> Batch:
    """``num_seqs`` sequences decoding the token after a ``CONTEXT``-token context."""
    slots = [
        _blocks(seq)[CONTEXT // BLOCK_SIZE] * BLOCK_SIZE + CONTEXT % BLOCK_SIZE for seq in range(num_seqs)
    ]
    return _batch(
        num_seqs,
        [1] * num_seqs,
        [CONTEXT] * num_seqs,
        slots,
        list(range(num_seqs + 1)),
        [CONTEXT + 1] * num_seqs,
        prefill=False,
    )


def _batch(num_seqs, token_ids, positions, slots, starts, context_lens, prefill: bool) -> Batch:
    return Batch(
        seq_ids=list(range(num_seqs)),
        token_ids=token_ids,
        positions=positions,
        slot_mapping=slots,
        query_start_loc=starts,
        context_lens=context_lens,
        block_tables=[_blocks(seq) for seq in range(num_seqs)],
        is_prefill=[prefill] * num_seqs,
        sample=[True] * num_seqs,
        num_prompt_tokens=[PROMPT if prefill else CONTEXT] * num_seqs,
        seeds=[None] * num_seqs,
        block_size=BLOCK_SIZE,
    )
