"""The ExecutorContext the cuda executor tests build executors with."""

from __future__ import annotations

from pathlib import Path

from hetero_core.executor import ExecutorContext


def executor_context(
    model_dir, *, num_blocks=64, block_size=16, max_model_len=256, max_num_seqs=8, options=None
):
    return ExecutorContext(
        settings=None, options=options, model_dir=Path(model_dir), num_blocks=num_blocks,
        block_size=block_size, max_model_len=max_model_len, max_num_batched_tokens=512,
        max_num_seqs=max_num_seqs, eos_token_id=None, vocab_size=0,
    )  # fmt: skip
