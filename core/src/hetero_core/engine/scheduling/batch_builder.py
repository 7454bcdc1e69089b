"""BatchBuilder: a step's ``Batch`` from the scheduled sequences, rebuilding only what changed.

What a sequence brings to every batch while it runs (its id, prompt length and seed) is kept in
columns that change only when the step's sequences do (one added, finished or preempted); a
sequence's block table is copied once per change of the table (``seq.block_table_copy``: a new
block every ``block_size`` decode steps), never per step. A decode-only step builds its per-token
columns (token ids, positions, slots, context lengths) in one pass over the sequences, with no
work per token beyond that. Every list handed out is new or never written again, so an executor
may keep reading a batch while the next one is built (async scheduling).

A token the engine does not know yet (sampled by the step still running, with async scheduling)
is ``PLACEHOLDER`` in ``token_ids``; its row is listed, and the engine writes the token in before
the executor sees the batch.
"""

from __future__ import annotations

from time import perf_counter

from hetero_core.engine.requests.sequence import Sequence
from hetero_core.engine.scheduling.batch import Batch

__all__ = ["PLACEHOLDER", "BatchBuilder"]
PLACEHOLDER = -1


class BatchBuilder:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._seqs: list[Sequence] = []  # the last batch's sequences, in order
        self._seq_ids: list[int] = []
        self._num_prompt_tokens: list[int] = []
        self._seeds: list[int | None] = []
        self._any_prompt_logprobs = False  # a sequence of the last batch asked for prompt_logprobs
        self._decode_starts: list[int] = [0]  # query_start_loc of a decode-only step of that many rows
        self._seconds = 0.0  # time spent building, since take_seconds()

    def take_seconds(self) -> float:
        """Seconds spent in ``build`` since the last call."""
        seconds, self._seconds = self._seconds, 0.0
        return seconds

    def build(self, step) -> tuple[Batch, list[int]]:
        """The batch of a ``StepBuilder`` whose sequences were just scheduled (their
        ``num_computed_tokens`` already include this step's tokens), and its placeholder rows."""
        started = perf_counter()
        seqs, num_new = step.seqs, step.num_new
        if seqs != self._seqs:  # identity comparison: a sequence joined, left, or the order changed
            self._seqs = seqs
            self._seq_ids = [s.seq_id for s in seqs]
            self._num_prompt_tokens = [len(s.prompt_token_ids) for s in seqs]
            self._seeds = [s.params.seed for s in seqs]
            self._any_prompt_logprobs = any(s.params.prompt_logprobs is not None for s in seqs)
        tables = [_table_copy(s) for s in seqs]
        spec = step.spec if step.num_spec_tokens else None
        if len(seqs) == step.num_tokens:
            token_ids, positions, slots, context_lens, placeholders = self._decode_columns(seqs, tables)
            starts = self._starts(len(seqs))
        else:
            token_ids, positions, slots, context_lens, placeholders, starts = self._columns(
                seqs, num_new, tables, spec
            )
        batch = Batch(
            seq_ids=self._seq_ids,
            token_ids=token_ids,
            positions=positions,
            slot_mapping=slots,
            query_start_loc=starts,
            context_lens=context_lens,
            block_tables=tables,
            is_prefill=step.is_prefill,
            sample=step.sample,
            num_prompt_tokens=self._num_prompt_tokens,
            seeds=self._seeds,
            block_size=self.block_size,
            prompt_logits=prompt_logits_column(seqs, step.is_prefill) if self._any_prompt_logprobs else None,
            num_spec_tokens=None if spec is None else [len(s) for s in spec],
        )
        self._seconds += perf_counter() - started
        return batch, placeholders

    def _decode_columns(self, seqs: list[Sequence], tables: list[list[int]]):
        """Columns of a step whose every sequence runs one token."""
        bs = self.block_size
        context_lens = [s.num_computed_tokens for s in seqs]
        token_ids, positions, slots, placeholders = [], [], [], []
        for row, (seq, table, end) in enumerate(zip(seqs, tables, context_lens)):
            position = end - 1
            positions.append(position)
            slots.append(table[position // bs] * bs + position % bs)
            offset = position - len(seq.prompt_token_ids)
            if offset < 0:
                token_ids.append(seq.prompt_token_ids[position])
            elif offset < len(seq.output_token_ids):
                token_ids.append(seq.output_token_ids[offset])
            else:
                token_ids.append(PLACEHOLDER)
                placeholders.append(row)
        return token_ids, positions, slots, context_lens, placeholders

    def _columns(self, seqs: list[Sequence], num_new: list[int], tables: list[list[int]], spec=None):
        """Columns of any step (prefill chunks among the sequences; ``spec``: each one's proposals,
        which follow its known tokens)."""
        bs = self.block_size
        token_ids, positions, slots, starts, context_lens, placeholders = [], [], [], [0], [], []
        for row, (seq, n, table) in enumerate(zip(seqs, num_new, tables)):
            end = seq.num_computed_tokens
            first = end - n
            known = min(end, seq.num_tokens)
            token_ids += seq.token_ids(first, known)
            if spec is not None and spec[row]:  # proposals to verify, after the last known token
                token_ids += spec[row]
            elif known < end:  # the step before samples it (a decode's one token)
                token_ids += [PLACEHOLDER] * (end - known)
                placeholders.append(row)
            for position in range(first, end):
                positions.append(position)
                slots.append(table[position // bs] * bs + position % bs)
            starts.append(starts[-1] + n)
            context_lens.append(end)
        return token_ids, positions, slots, context_lens, placeholders, starts

    def _starts(self, num_seqs: int) -> list[int]:
        if len(self._decode_starts) != num_seqs + 1:
            self._decode_starts = list(range(num_seqs + 1))
        return self._decode_starts


def prompt_logits_column(seqs: list[Sequence], is_prefill: list[bool]) -> list[bool] | None:
    """``Batch.prompt_logits``: the prefill segments of sequences that asked for prompt_logprobs and
    have not got them all yet (a recompute after preemption runs its prompt again without them)."""
    flags = [
        prefill
        and s.params.prompt_logprobs is not None
        and len(s.prompt_logprobs or (None,)) < len(s.prompt_token_ids)
        for s, prefill in zip(seqs, is_prefill)
    ]
    return flags if any(flags) else None


def _table_copy(seq: Sequence) -> list[int]:
    """The sequence's block table as batches share it: copied again only when the table changed."""
    copy = seq.block_table_copy
    if copy is None or len(copy) != len(seq.block_table):
        copy = seq.block_table_copy = list(seq.block_table)
    return copy
