"""The batch: everything an executor needs for one step, passed explicitly.

All scheduled tokens of a step are flattened into one list (no padding). Sequence ``i`` owns
``token_ids[query_start_loc[i]:query_start_loc[i + 1]]``. Plain Python lists keep the planning
side free of torch; a real executor turns them into tensors once per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def slot_of(block_table, position, block_size: int):
    """The KV-cache slot of the token at ``position``: ``block_table[position // block_size] *
    block_size + position % block_size``.

    The one definition of the paged layout, shared by the scheduler, the attention backends and the
    executors. ``block_table`` and ``position`` may be a list and an int, or torch tensors (a tensor
    of positions gives a tensor of slots).
    """
    return block_table[position // block_size] * block_size + position % block_size


@dataclass(frozen=True)
class Batch:
    """One step's work for the executor.

    - ``seq_ids``: one id per scheduled sequence (stable for the life of a request).
    - ``token_ids`` / ``positions`` / ``slot_mapping``: one entry per scheduled token. The slot of a
      token is ``slot_of(block_table, position, block_size)``: the executor writes that token's K/V
      there before attending.
    - ``query_start_loc``: offsets into the flat token list, ``len == num_seqs + 1``.
    - ``context_lens``: tokens in the KV cache for each sequence once this step's tokens are written
      (cached prefix + new tokens). ``num_computed_tokens[i] = context_lens[i] - query_len(i)`` are
      already cached: a prefill segment may continue a cached prefix (chunked prefill, recompute).
    - ``block_tables``: the KV blocks each sequence owns, in order.
    - ``is_prefill``: True when the sequence's segment is (part of) its prompt processing.
    - ``sample``: True when the executor must produce a next token for the sequence (decode, or the
      last chunk of a prefill). Rows of the output follow the sequences with ``sample`` set, in order.
    - ``num_prompt_tokens`` / ``seeds``: per-sequence request facts for executors that need them
      (the mock derives its tokens from them; real executors can ignore them).
    - ``token_bitmask``: None, or which tokens each sampled row may take (structured output; layout in
      ``hetero_core.engine.sampling.token_bitmask``). Core's sampler applies it to logits; an executor that
      returns token ids must pick allowed ones (the engine fails a request given a forbidden one).
    - ``prompt_logits``: None, or per sequence True when the executor must also return the logits
      of every token the sequence runs in this step (a prompt segment of a request that asked for
      ``prompt_logprobs``), in ``ExecutorOutput.prompt_logits``. Only executors that declare
      ``supports_prompt_logits = True`` get such batches; the engine refuses ``prompt_logprobs``
      for the others.
    """

    seq_ids: list[int]
    token_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    query_start_loc: list[int]
    context_lens: list[int]
    block_tables: list[list[int]]
    is_prefill: list[bool]
    sample: list[bool]
    num_prompt_tokens: list[int]
    seeds: list[int | None]
    block_size: int
    token_bitmask: Any = (
        None  # structured output: int32 [sampled rows, words] (engine.token_bitmask), or None
    )
    prompt_logits: list[bool] | None = None  # prompt logprobs: sequences whose every row's logits come back
    num_spec_tokens: list[int] | None = (
        None  # speculative decoding: proposed tokens at the end of each segment
    )

    @property
    def prompt_logits_indices(self) -> list[int]:
        """Indices (into the sequences) whose logits at every scheduled token are returned, in order."""
        return [] if self.prompt_logits is None else [i for i, flag in enumerate(self.prompt_logits) if flag]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def query_len(self, i: int) -> int:
        return self.query_start_loc[i + 1] - self.query_start_loc[i]

    def num_computed_tokens(self, i: int) -> int:
        return self.context_lens[i] - self.query_len(i)

    @property
    def sample_indices(self) -> list[int]:
        """Indices (into the sequences) that need a next token, in output-row order."""
        return [i for i, flag in enumerate(self.sample) if flag]

    @property
    def num_sampled_rows(self) -> int:
        """Rows of the output: one per sampled sequence, plus its proposals (``num_spec_tokens``)."""
        if self.num_spec_tokens is None:
            return sum(self.sample)
        return sum(1 + n for flag, n in zip(self.sample, self.num_spec_tokens) if flag)


@dataclass(frozen=True)
class ExecutorOutput:
    """What an executor returns for a batch: next tokens, or logits for core's sampler.

    Exactly one of the two is set. Either has one row per sequence with ``batch.sample`` set, in
    batch order: ``token_ids`` a list of ints, ``logits`` a ``[num_rows, vocab_size]`` tensor. With
    ``batch.num_spec_tokens`` set, a sampled sequence with ``n`` proposals has ``1 + n`` consecutive
    rows (the prediction after each of its last ``1 + n`` tokens): ``batch.num_sampled_rows`` in all.

    ``prompt_logits`` (executors with ``supports_prompt_logits = True``, when ``batch.prompt_logits``
    is set): one fp32 tensor per sequence flagged there, in batch order, ``[query_len(i),
    vocab_size]``: row ``j`` holds the logits after the token at ``positions[query_start_loc[i] + j]``
    (the prediction of the token after it). None otherwise.
    """

    token_ids: list[int] | None = None
    logits: object | None = None
    prompt_logits: list | None = None

    def __post_init__(self) -> None:
        if (self.token_ids is None) == (self.logits is None):
            raise ValueError("ExecutorOutput needs exactly one of token_ids or logits")
