"""ExecutorContract: the tests every executor plugin passes, as a mixin an outside plugin subclasses.

```python
from hetero_core.testing import ExecutorContract

class TestMyExecutor(ExecutorContract):
    vocab_size = 96                      # token ids the contract feeds: [2, vocab_size)

    def make_executor(self, ctx):        # ctx: an ExecutorContext (ctx.model_dir = self.model_dir)
        return MyExecutor(ctx)

    def reference_greedy(self, prompt_token_ids, num_tokens):   # optional
        return my_reference_model_greedy(prompt_token_ids, num_tokens)
```

Set ``model_dir`` (a class attribute, or in an autouse fixture: ``self.model_dir = ...``) for an
executor that runs a model. Every check runs the same teacher-forced sequences (a prompt, then
fixed "decoded" tokens) under different schedules and compares the output row at every sampled
position: token ids exactly, logits within ``logits_atol``. The checks:

- one output row per sampled sequence: ``token_ids`` ints in the vocabulary, or finite logits
  ``[rows, vocab]``;
- block tables are honoured: shuffled, non-contiguous tables give the rows of contiguous ones;
- slot writes land where the batch says: a second sequence that reuses the first one's full
  blocks as its cached prefix (as prefix caching does) gets the first one's rows;
- chunked prefill gives the rows of an unchunked one;
- mixed batches (prefill chunks beside decodes, several sequences) give the rows of running each
  sequence alone;
- greedy decoding equals ``reference_greedy`` (where two candidates' logits are within
  ``logits_atol``, either is accepted); without a reference, two fresh executors agree.

Nothing here imports torch unless an executor returns logits.
"""

from __future__ import annotations

import random
from typing import Any

from hetero_core.engine.batch import ExecutorOutput
from hetero_core.executor import ExecutorContext
from hetero_core.testing.paged import BlockPool, ContractSequence, build_batch


class ExecutorContract:
    block_size: int = 16
    num_blocks: int = 64
    vocab_size: int = 96
    prompt_lengths: tuple[int, ...] = (37, 9, 3)  # the first spans several blocks and is chunked
    num_fed_tokens: int = 3  # teacher-forced "decoded" tokens after each prompt
    prefill_chunk: int = 7  # chunk size of the chunked and mixed schedules
    num_greedy_tokens: int = 6
    logits_atol: float = 1e-3
    model_dir: Any = None

    # -- what a plugin provides -------------------------------------------------------------------
    def make_executor(self, ctx: ExecutorContext):
        raise NotImplementedError("subclass ExecutorContract and implement make_executor(ctx)")

    def reference_greedy(self, prompt_token_ids: list[int], num_tokens: int) -> list[int] | None:
        """The greedy tokens a reference implementation produces; None: check determinism only."""
        return None

    def make_context(self, **overrides) -> ExecutorContext:
        values = dict(
            settings=None, options=None, model_dir=self.model_dir, num_blocks=self.num_blocks,
            block_size=self.block_size, max_model_len=256, max_num_batched_tokens=512, max_num_seqs=8,
            eos_token_id=None, vocab_size=self.vocab_size,
        )  # fmt: skip
        values.update(overrides)
        return ExecutorContext(**values)

    # -- the contract -----------------------------------------------------------------------------
    def test_output_has_one_row_per_sampled_sequence(self):
        executor = self._executor()
        seqs = self._sequences()
        first_chunk = min(self.prefill_chunk, seqs[0].num_prompt_tokens - 1)
        segments = [(seqs[0], first_chunk)] + [(s, s.num_prompt_tokens) for s in seqs[1:]]
        batch = build_batch(segments, BlockPool(self.num_blocks), self.block_size)
        output = executor.execute(batch)
        assert isinstance(output, ExecutorOutput), f"execute() returned {type(output).__name__}, not ExecutorOutput"
        num_rows = len(batch.sample_indices)
        assert num_rows == len(seqs) - 1
        if output.token_ids is not None:
            assert len(output.token_ids) == num_rows, f"{len(output.token_ids)} token ids for {num_rows} rows"
            for token_id in output.token_ids:
                assert isinstance(token_id, int) and 0 <= token_id < executor_vocab(executor, self.vocab_size), token_id
        else:
            import torch

            logits = output.logits
            assert isinstance(logits, torch.Tensor) and logits.dim() == 2, f"logits: {type(logits)}"
            assert logits.shape[0] == num_rows, f"logits rows {logits.shape[0]} for {num_rows} sampled sequences"
            assert logits.shape[1] == executor_vocab(executor, logits.shape[1]) > 0
            assert logits.dtype.is_floating_point and bool(torch.isfinite(logits).all())

    def test_block_tables_are_honoured(self):
        contiguous = self._run(self._alone_schedule(chunk=None), shuffle=False)
        shuffled = self._run(self._alone_schedule(chunk=None), shuffle=True)
        self._assert_same_rows(shuffled, contiguous, "shuffled, non-contiguous block tables")

    def test_slot_writes_land_where_the_batch_says(self):
        """A copy of sequence 0 that takes its full blocks as a cached prefix reads what sequence 0
        wrote there, through its own block table, and must give sequence 0's rows."""
        executor = self._executor()
        pool = BlockPool(self.num_blocks, shuffle=True, seed=3)
        original = self._sequences()[0]
        num_cached = (original.num_prompt_tokens // self.block_size) * self.block_size
        assert num_cached > 0, "the first prompt must span at least one full block"
        expected = self._execute(executor, [[(original, original.num_prompt_tokens)], [(original, 1)]], pool)
        copy = ContractSequence(100, list(original.token_ids), original.num_prompt_tokens, num_computed=num_cached,
                                block_table=list(original.block_table[: num_cached // self.block_size]))
        got = self._execute(executor, [[(copy, original.num_prompt_tokens - num_cached)], [(copy, 1)]], pool)
        self._assert_same_rows({k[1]: v for k, v in got.items()}, {k[1]: v for k, v in expected.items()},
                               "a sequence reading another's cached blocks")

    def test_chunked_prefill_matches_unchunked(self):
        whole = self._run(self._alone_schedule(chunk=None))
        chunked = self._run(self._alone_schedule(chunk=self.prefill_chunk))
        self._assert_same_rows(chunked, whole, f"prefill in chunks of {self.prefill_chunk}")

    def test_mixed_prefill_and_decode_batches_match_separate_runs(self):
        alone = self._run(self._alone_schedule(chunk=None))
        mixed = self._run(self._mixed_schedule(), shuffle=True)
        self._assert_same_rows(mixed, alone, "mixed prefill + decode batches")

    def test_greedy_matches_the_reference(self):
        prompt = self._sequences()[0].token_ids[: self.prompt_lengths[0]]
        reference = self.reference_greedy(list(prompt), self.num_greedy_tokens)
        if reference is None:
            first, _ = self._greedy(self._executor(), prompt, feed=None)
            second, _ = self._greedy(self._executor(), prompt, feed=None)
            assert first == second, f"two fresh executors disagree: {first} vs {second}"
            return
        chosen, rows = self._greedy(self._executor(), prompt, feed=list(reference))
        for step, (want, got, row) in enumerate(zip(reference, chosen, rows)):
            if got != want:
                margin = None if row is None else float(row[got] - row[want])
                assert margin is not None and margin <= self.logits_atol, (
                    f"greedy token {step}: executor chose {got}, reference {want} (logit margin {margin})"
                )

    # -- helpers ----------------------------------------------------------------------------------
    def _executor(self):
        executor = self.make_executor(self.make_context())
        self.__dict__.setdefault("_contract_executors", []).append(executor)
        return executor

    def teardown_method(self, method):
        for executor in self.__dict__.pop("_contract_executors", []):
            executor.shutdown()

    def _sequences(self) -> list[ContractSequence]:
        rng = random.Random(1234)
        seqs = []
        for i, length in enumerate(self.prompt_lengths):
            tokens = [rng.randrange(2, self.vocab_size) for _ in range(length + self.num_fed_tokens)]
            seqs.append(ContractSequence(i, tokens, length))
        return seqs

    def _alone_schedule(self, chunk: int | None) -> list[list[tuple[int, int]]]:
        steps = []
        for i, length in enumerate(self.prompt_lengths):
            done = 0
            while done < length:
                n = length - done if chunk is None else min(chunk, length - done)
                steps.append([(i, n)])
                done += n
            steps += [[(i, 1)] for _ in range(self.num_fed_tokens)]
        return steps

    def _mixed_schedule(self) -> list[list[tuple[int, int]]]:
        done = [0] * len(self.prompt_lengths)
        total = [n + self.num_fed_tokens for n in self.prompt_lengths]
        steps = []
        while done != total:
            step = []
            for i in reversed(range(len(done))):  # later (shorter) sequences first: decodes beside chunks
                if done[i] < total[i]:
                    left = self.prompt_lengths[i] - done[i]
                    n = min(self.prefill_chunk, left) if left > 0 else 1
                    step.append((i, n))
                    done[i] += n
            steps.append(step)
        return steps

    def _run(self, schedule, shuffle: bool = False) -> dict:
        seqs = self._sequences()
        pool = BlockPool(self.num_blocks, shuffle=shuffle, seed=7)
        steps = [[(seqs[i], n) for i, n in step] for step in schedule]
        return self._execute(self._executor(), steps, pool)

    def _execute(self, executor, steps, pool) -> dict:
        """(seq_id, position produced) -> output row, for every sampled row of every step."""
        rows = {}
        for segments in steps:
            batch = build_batch(segments, pool, self.block_size)
            output = executor.execute(batch)
            values = output.token_ids if output.token_ids is not None else list(output.logits)
            for row, i in zip(values, batch.sample_indices):
                rows[(batch.seq_ids[i], batch.context_lens[i])] = row
        return rows

    def _greedy(self, executor, prompt, feed):
        """Greedy decoding; ``feed``: tokens to feed instead of the executor's own (teacher forcing)."""
        seq = ContractSequence(0, list(prompt), len(prompt))
        pool = BlockPool(self.num_blocks)
        chosen, rows = [], []
        for step in range(self.num_greedy_tokens):
            output = executor.execute(build_batch([(seq, seq.num_remaining)], pool, self.block_size))
            if output.token_ids is not None:
                token, row = output.token_ids[0], None
            else:
                row = output.logits[0]
                token = int(row.argmax())
            chosen.append(token)
            rows.append(row)
            seq.token_ids.append(token if feed is None else feed[step])
        return chosen, rows

    def _assert_same_rows(self, got: dict, expected: dict, what: str) -> None:
        assert got.keys() == expected.keys(), f"{what}: sampled positions differ"
        for key, want in expected.items():
            have = got[key]
            if isinstance(want, int):
                assert have == want, f"{what}: token at {key} is {have}, expected {want}"
            else:
                diff = float((have.float() - want.float()).abs().max())
                assert diff <= self.logits_atol, f"{what}: logits at {key} differ by {diff} (> {self.logits_atol})"


def executor_vocab(executor, default: int) -> int:
    return getattr(executor, "vocab_size", None) or default
