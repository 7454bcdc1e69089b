"""ExecutorContract: the tests every executor plugin passes, as a mixin an outside plugin subclasses.

```python
from hetero_core.testing import ExecutorContract

class TestMyExecutor(ExecutorContract):
    vocab_size = 96                      # ctx.vocab_size; fed token ids are drawn from [2, vocab_size)

    def make_executor(self, ctx):        # ctx: an ExecutorContext built from the attributes below
        return MyExecutor(ctx)

    def reference_greedy(self, prompt_token_ids, num_tokens):   # optional
        return my_reference_model_greedy(prompt_token_ids, num_tokens)
```

What the kit hands ``make_executor`` (``make_context``), and what a wrapped executor may need set:

- ``ctx.vocab_size`` = ``vocab_size`` (96): the tokenizer's vocabulary, as the engine passes it. For a
  model, its vocabulary. An executor that checks its own range against it needs at least that range:
  the mock draws tokens below its ``vocab_size`` option (127), so wrapping it takes ``vocab_size >= 127``
  (its own tests use 258, the byte tokenizer's, which the engine would pass).
- ``ctx.options`` = ``executor_options()`` (None): your validated options model instance.
- ``ctx.model_dir`` = ``model_dir`` (None): set it (a class attribute, or in an autouse fixture:
  ``self.model_dir = ...``) for an executor that runs a model.
- ``ctx.num_blocks`` / ``ctx.block_size`` = ``num_blocks`` (64) / ``block_size`` (16);
  ``max_model_len`` 256, ``max_num_batched_tokens`` 512, ``max_num_seqs`` 8, ``eos_token_id`` None,
  ``num_swap_blocks`` 0 (for the swap check ``num_swap_blocks``, default: the blocks of the first
  prompt), no tensor parallelism.
- ``ctx.settings`` is None: read your options, not settings.

If ``make_executor`` raises, the failure names this context. Every check runs the same
teacher-forced sequences (a prompt, then fixed "decoded" tokens) under different schedules and
compares the output row at every sampled position: token ids exactly, logits within ``logits_atol``.
The checks (each failure is a ``ContractFailure`` naming the rule and the offending value):

- the executor declares what it can do: ``capabilities`` is an ``ExecutorCapabilities`` and every
  method it declares is callable; every check below that a declaration enables is run;
- one output row per sampled sequence: ``token_ids`` ints in the vocabulary, or finite logits
  ``[rows, vocab]`` (``capabilities.vocab_size`` wide when declared);
- block tables are honoured: shuffled, non-contiguous tables give the rows of contiguous ones;
- slot writes land where the batch says: a second sequence that reuses the first one's full
  blocks as its cached prefix (as prefix caching does) gets the first one's rows;
- chunked prefill gives the rows of an unchunked one;
- mixed batches (prefill chunks beside decodes, several sequences) give the rows of running each
  sequence alone;
- declared block transfers move blocks: after ``copy_blocks`` (``block_copy``), a ``swap_out`` then
  ``swap_in`` (``block_swap``), or an ``export_blocks`` from one executor and an ``import_blocks``
  into a fresh one (``kv_export`` and ``kv_import``; exported tensors hold the blocks along
  ``kv_block_dim``), a sequence reading the destination blocks as its cached prefix gets the rows
  of the sequence that wrote the source blocks;
- async scheduling: an executor that declares ``prefers_async_scheduling`` gives the same rows when
  ``execute`` runs on another thread (the engine's executor thread);
- prompt logits: an executor that declares ``supports_prompt_logits=True`` returns, for every
  sequence ``batch.prompt_logits`` flags, a finite ``[query_len, vocab]`` tensor whose last row is
  the sampled row (when sampled) and whose rows are the same chunked or not and beside other
  sequences; one that does not declare it gets a one-line refusal of ``prompt_logprobs`` from the
  engine (``engine.prompt_logprobs.prompt_logprobs_refusal``) naming it;
- speculative decoding: an executor that declares ``supports_speculative_decoding=True`` returns,
  for a sampled sequence with ``n`` of ``batch.num_spec_tokens``, ``1 + n`` rows equal to those
  one-token steps give at the same positions;
- greedy decoding equals ``reference_greedy`` (where two candidates' logits are within
  ``logits_atol``, either is accepted); without a reference, two fresh executors agree.

Nothing here imports torch unless an executor returns logits, nor pytest or hypothesis.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from typing import Any

from hetero_core.engine.executor_capabilities import capabilities_problem
from hetero_core.engine.sampling.prompt_logprobs import prompt_logprobs_refusal
from hetero_core.executor import ExecutorCapabilities, ExecutorContext, ExecutorOutput
from hetero_core.kv_transfer import KVTensor
from hetero_core.testing.contract_failure import ContractFailure
from hetero_core.testing.executor_checks import check_output, check_same_rows
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
    num_swap_blocks: int | None = None  # the swap check's ctx.num_swap_blocks (None: the first prompt's)

    # -- what a plugin provides -------------------------------------------------------------------
    def make_executor(self, ctx: ExecutorContext):
        raise NotImplementedError("subclass ExecutorContract and implement make_executor(ctx)")

    def executor_options(self) -> Any:
        """``ctx.options``: your executor's validated options model instance (None: its defaults)."""
        return None

    def reference_greedy(self, prompt_token_ids: list[int], num_tokens: int) -> list[int] | None:
        """The greedy tokens a reference implementation produces; None: check determinism only."""
        return None

    def make_context(self, **overrides) -> ExecutorContext:
        values = dict(
            settings=None, options=self.executor_options(), model_dir=self.model_dir,
            num_blocks=self.num_blocks, block_size=self.block_size, max_model_len=256,
            max_num_batched_tokens=512, max_num_seqs=8,
            eos_token_id=None, vocab_size=self.vocab_size,
        )  # fmt: skip
        values.update(overrides)
        return ExecutorContext(**values)

    # -- the contract -----------------------------------------------------------------------------
    def test_capabilities_are_declared(self):
        self._capabilities(self._executor())

    def test_output_has_one_row_per_sampled_sequence(self):
        executor = self._executor()
        seqs = self._sequences()
        first_chunk = min(self.prefill_chunk, seqs[0].num_prompt_tokens - 1)
        segments = [(seqs[0], first_chunk)] + [(s, s.num_prompt_tokens) for s in seqs[1:]]
        batch = build_batch(segments, BlockPool(self.num_blocks), self.block_size)
        check_output(
            executor.execute(batch),
            len(batch.sample_indices),
            self.vocab_size,
            self._capabilities(executor).vocab_size,
        )

    def test_block_tables_are_honoured(self):
        contiguous = self._run(self._alone_schedule(chunk=None), shuffle=False)
        shuffled = self._run(self._alone_schedule(chunk=None), shuffle=True)
        check_same_rows(
            shuffled,
            contiguous,
            "block tables are honoured",
            "shuffled, non-contiguous block tables",
            self.logits_atol,
        )

    def test_slot_writes_land_where_the_batch_says(self):
        """A copy of sequence 0 that takes its full blocks as a cached prefix reads what sequence 0
        wrote there, through its own block table, and must give sequence 0's rows."""
        executor = self._executor()
        pool = BlockPool(self.num_blocks, shuffle=True, seed=3)
        original = self._sequences()[0]
        num_cached = (original.num_prompt_tokens // self.block_size) * self.block_size
        if num_cached == 0:
            raise ValueError(
                f"prompt_lengths[0] ({original.num_prompt_tokens}) must span at least one full "
                f"block (block_size {self.block_size}); raise it in your test class"
            )
        expected = self._execute(executor, [[(original, original.num_prompt_tokens)], [(original, 1)]], pool)
        copy = ContractSequence(
            100,
            list(original.token_ids),
            original.num_prompt_tokens,
            num_computed=num_cached,
            block_table=list(original.block_table[: num_cached // self.block_size]),
        )
        got = self._execute(executor, [[(copy, original.num_prompt_tokens - num_cached)], [(copy, 1)]], pool)
        check_same_rows(
            {k[1]: v for k, v in got.items()},
            {k[1]: v for k, v in expected.items()},
            "slot writes land where the batch says",
            "a sequence reading another's cached blocks",
            self.logits_atol,
        )

    def test_declared_block_copies_copy(self):
        executor = self._executor()
        if not self._capabilities(executor).block_copy:
            return
        pool = BlockPool(self.num_blocks, shuffle=True, seed=11)
        original, expected = self._written_prompt(executor, pool)
        sources = self._full_blocks(original)
        destinations = [pool.take() for _ in sources]
        executor.copy_blocks(list(zip(sources, destinations)))
        check_same_rows(
            self._read_prefix(executor, original, destinations, pool),
            expected,
            "copy_blocks copies whole blocks (block_copy)",
            "a sequence reading the copies",
            self.logits_atol,
        )

    def test_declared_swaps_round_trip(self):
        num_swap_blocks = self.num_swap_blocks or -(-self.prompt_lengths[0] // self.block_size)
        executor = self._executor(num_swap_blocks=num_swap_blocks)
        if not self._capabilities(executor).block_swap:
            return
        pool = BlockPool(self.num_blocks, shuffle=True, seed=13)
        original, expected = self._written_prompt(executor, pool)
        sources = self._full_blocks(original)
        if len(sources) > num_swap_blocks:
            raise ValueError(
                f"num_swap_blocks ({num_swap_blocks}) must hold the {len(sources)} full blocks "
                f"of prompt_lengths[0]; raise it in your test class"
            )
        swap_blocks = list(range(len(sources)))[::-1]
        destinations = [pool.take() for _ in sources]
        executor.swap_out(list(zip(sources, swap_blocks)))
        executor.swap_in(list(zip(swap_blocks, destinations)))
        check_same_rows(
            self._read_prefix(executor, original, destinations, pool),
            expected,
            "swap_out then swap_in gives the blocks back (block_swap)",
            "a sequence reading swapped-in blocks",
            self.logits_atol,
        )

    def test_declared_kv_transfer_moves_blocks(self):
        exporter = self._executor()
        capabilities = self._capabilities(exporter)
        if not capabilities.kv_export:
            return
        pool = BlockPool(self.num_blocks, shuffle=True, seed=17)
        original, expected = self._written_prompt(exporter, pool)
        sources = self._full_blocks(original)
        layers = exporter.export_blocks(sources)
        if (
            not isinstance(layers, list)
            or not all(
                isinstance(layer, tuple) and layer and all(isinstance(t, KVTensor) for t in layer)
                for layer in layers
            )
            or not layers
        ):
            raise ContractFailure(
                "export_blocks returns a list of layers, each a tuple of KVTensor (kv_export)",
                f"got {_describe_layers(layers)}",
            )
        dim = capabilities.kv_block_dim
        shapes = [t.shape for layer in layers for t in layer]
        if any(len(shape) <= dim or shape[dim] != len(sources) for shape in shapes):
            raise ContractFailure(
                f"exported tensors hold the blocks along kv_block_dim ({dim})",
                f"{len(sources)} blocks exported as shapes {sorted(set(shapes))}",
            )
        importer = self._executor()
        if not self._capabilities(importer).kv_import:
            return
        pool = BlockPool(self.num_blocks, shuffle=True, seed=19)
        destinations = [pool.take() for _ in sources]
        importer.import_blocks(destinations, layers)
        check_same_rows(
            self._read_prefix(importer, original, destinations, pool),
            expected,
            "import_blocks writes what export_blocks exported (kv_export, kv_import)",
            "a fresh executor reading imported blocks",
            self.logits_atol,
        )

    def test_declared_async_scheduling_runs_on_another_thread(self):
        if not self._capabilities(self._executor()).prefers_async_scheduling:
            return
        here = self._run(self._alone_schedule(chunk=None))
        there: dict = {}

        def run():
            there["rows"] = self._run(self._alone_schedule(chunk=None))

        thread = threading.Thread(target=run, name="contract-executor-thread")
        thread.start()
        thread.join()
        check_same_rows(
            there.get("rows", {}),
            here,
            "execute gives the same rows on another thread (prefers_async_scheduling)",
            "the executor thread",
            self.logits_atol,
        )

    def test_chunked_prefill_matches_unchunked(self):
        whole = self._run(self._alone_schedule(chunk=None))
        chunked = self._run(self._alone_schedule(chunk=self.prefill_chunk))
        check_same_rows(
            chunked,
            whole,
            "chunked prefill gives the rows of an unchunked one",
            f"prefill in chunks of {self.prefill_chunk}",
            self.logits_atol,
        )

    def test_mixed_prefill_and_decode_batches_match_separate_runs(self):
        alone = self._run(self._alone_schedule(chunk=None))
        mixed = self._run(self._mixed_schedule(), shuffle=True)
        check_same_rows(
            mixed,
            alone,
            "a batch gives each sequence the rows it gets alone",
            "mixed prefill + decode batches",
            self.logits_atol,
        )

    def test_prompt_logits_are_returned_or_refused(self):
        executor = self._executor()
        if not self._capabilities(executor).supports_prompt_logits:
            refusal = prompt_logprobs_refusal(executor)
            if not refusal or type(executor).__name__ not in refusal:
                raise ContractFailure("an executor without prompt logits is refused by name", repr(refusal))
            return
        whole = self._prompt_rows(self._alone_schedule(chunk=None))
        mixed = self._prompt_rows(self._mixed_schedule())
        check_same_rows(
            mixed,
            whole,
            "prompt logits are the same chunked, beside other sequences or not",
            "mixed prefill + decode batches with prompt_logits",
            self.logits_atol,
        )

    def test_speculative_rows_match_one_token_steps(self):
        """An executor that declares ``supports_speculative_decoding=True`` returns, for a sampled
        sequence with ``n`` of ``batch.num_spec_tokens``, ``1 + n`` rows: those that one-token steps
        give at the same positions (the engine refuses speculation for any other executor)."""
        executor = self._executor()
        capabilities = self._capabilities(executor)
        if not capabilities.supports_speculative_decoding:
            return
        alone = self._run(self._alone_schedule(chunk=None))
        seqs, pool, rows = self._sequences(), BlockPool(self.num_blocks, shuffle=True, seed=5), {}
        # after the prompts, one step: the first sequence verifies all its fed tokens but the first
        # as proposals, the second none, the third one (each sequence's first fed token is its "last")
        spec = [
            [self.num_fed_tokens - 1, 0, min(1, self.num_fed_tokens - 1)][i % 3] for i in range(len(seqs))
        ]
        steps = [
            ([(s, s.num_prompt_tokens) for s in seqs], [0] * len(seqs)),
            ([(s, 1 + n) for s, n in zip(seqs, spec)], spec),
        ]
        for segments, proposals in steps:
            batch = build_batch(segments, pool, self.block_size)
            batch = dataclasses.replace(batch, num_spec_tokens=list(proposals))
            output = executor.execute(batch)
            check_output(output, batch.num_sampled_rows, self.vocab_size, capabilities.vocab_size)
            values = iter(output.token_ids if output.token_ids is not None else list(output.logits))
            for i in batch.sample_indices:
                for position in range(batch.context_lens[i] - proposals[i], batch.context_lens[i] + 1):
                    rows[(batch.seq_ids[i], position)] = next(values)
        check_same_rows(
            rows,
            {key: alone[key] for key in rows},
            "1 + n rows per sequence with n proposals",
            "a batch with num_spec_tokens",
            self.logits_atol,
        )

    def test_greedy_matches_the_reference(self):
        prompt = self._sequences()[0].token_ids[: self.prompt_lengths[0]]
        reference = self.reference_greedy(list(prompt), self.num_greedy_tokens)
        if reference is None:
            first, _ = self._greedy(self._executor(), prompt, feed=None)
            second, _ = self._greedy(self._executor(), prompt, feed=None)
            if first != second:
                raise ContractFailure(
                    "greedy decoding is deterministic", f"two fresh executors chose {first} and {second}"
                )
            return
        chosen, rows = self._greedy(self._executor(), prompt, feed=list(reference))
        for step, (want, got, row) in enumerate(zip(reference, chosen, rows)):
            if got != want:
                margin = None if row is None else float(row[got] - row[want])
                if margin is None or margin > self.logits_atol:
                    raise ContractFailure(
                        "greedy decoding matches reference_greedy",
                        f"token {step}: executor chose {got}, reference {want} "
                        f"(logit margin {margin}, logits_atol {self.logits_atol})",
                    )

    # -- helpers ----------------------------------------------------------------------------------
    def _capabilities(self, executor) -> ExecutorCapabilities:
        """The executor's declaration, or a ContractFailure saying what is wrong with it."""
        rule = "an executor declares its capabilities (hetero_core.executor.ExecutorCapabilities)"
        if not hasattr(executor, "capabilities"):
            raise ContractFailure(rule, f"{type(executor).__name__} has no capabilities attribute")
        problem = capabilities_problem(executor)
        if problem:
            raise ContractFailure(rule, f"{type(executor).__name__}: {problem}")
        return executor.capabilities

    def _written_prompt(self, executor, pool) -> tuple[ContractSequence, dict]:
        """Sequence 0 run on ``executor`` (its prompt, then one fed token): (it, position -> row)."""
        original = self._sequences()[0]
        if original.num_prompt_tokens <= self.block_size:
            raise ValueError(
                f"prompt_lengths[0] ({original.num_prompt_tokens}) must exceed block_size "
                f"({self.block_size}) for the block transfer checks; raise it in your test "
                "class"
            )
        rows = self._execute(executor, [[(original, original.num_prompt_tokens)], [(original, 1)]], pool)
        return original, {k[1]: v for k, v in rows.items()}

    def _full_blocks(self, seq: ContractSequence) -> list[int]:
        """The blocks of ``seq``'s prompt that hold only prompt tokens, at least one left to compute."""
        return seq.block_table[: (seq.num_prompt_tokens - 1) // self.block_size]

    def _read_prefix(self, executor, original: ContractSequence, blocks: list[int], pool) -> dict:
        """position -> row of a copy of ``original`` whose cached prefix is ``blocks`` (read through its own
        block table), computing the rest of the prompt and one fed token on ``executor``."""
        num_cached = len(blocks) * self.block_size
        copy = ContractSequence(
            100,
            list(original.token_ids),
            original.num_prompt_tokens,
            num_computed=num_cached,
            block_table=list(blocks),
        )
        rows = self._execute(executor, [[(copy, original.num_prompt_tokens - num_cached)], [(copy, 1)]], pool)
        return {k[1]: v for k, v in rows.items()}

    def _executor(self, **context):
        ctx = self.make_context(**context)
        try:
            executor = self.make_executor(ctx)
        except Exception as exc:
            raise RuntimeError(
                f"make_executor(ctx) raised {type(exc).__name__}: {exc} (the kit's context: vocab_size="
                f"{ctx.vocab_size}, block_size={ctx.block_size}, num_blocks={ctx.num_blocks}, options="
                f"{ctx.options!r}, model_dir={ctx.model_dir}; set them in your test class: see "
                "hetero_core.testing.executor_contract)"
            ) from exc
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

    def _prompt_rows(self, schedule) -> dict:
        """(seq_id, position) -> prompt logits row, for every prompt position of every sequence."""
        import dataclasses

        seqs, executor = self._sequences(), self._executor()
        pool, rows = BlockPool(self.num_blocks), {}
        for step in schedule:
            batch = build_batch([(seqs[i], n) for i, n in step], pool, self.block_size)
            batch = dataclasses.replace(batch, prompt_logits=list(batch.is_prefill))
            output = executor.execute(batch)
            flagged = batch.prompt_logits_indices
            got = output.prompt_logits
            if not isinstance(got, list) or len(got) != len(flagged):
                raise ContractFailure(
                    "prompt_logits: one tensor per flagged sequence",
                    f"{len(flagged)} flagged, got {type(got).__name__} of {len(got or [])}",
                )
            sampled = dict(zip(batch.sample_indices, list(output.logits)))
            for i, logits in zip(flagged, got):
                check_output(
                    ExecutorOutput(logits=logits),
                    batch.query_len(i),
                    self.vocab_size,
                    executor.capabilities.vocab_size,
                )
                if i in sampled:
                    check_same_rows(
                        {0: logits[-1]},
                        {0: sampled[i]},
                        "the last prompt logits row is the sampled row",
                        "a sampled prompt segment",
                        self.logits_atol,
                    )
                first = batch.positions[batch.query_start_loc[i]]
                for j, row in enumerate(logits):
                    rows[(batch.seq_ids[i], first + j)] = row
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


def _describe_layers(layers) -> str:
    if not isinstance(layers, list):
        return type(layers).__name__
    return (
        "["
        + ", ".join(
            type(layer).__name__
            if not isinstance(layer, tuple)
            else "(" + ", ".join(type(t).__name__ for t in layer) + ")"
            for layer in layers[:3]
        )
        + (", ...]" if len(layers) > 3 else "]")
    )
