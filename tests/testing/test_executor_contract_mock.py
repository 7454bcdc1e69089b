"""The mock executor passes core's executor contract (its reference: its own determinism)."""

from __future__ import annotations

import subprocess
import sys
from array import array

import pytest

from hetero_core.testing import ContractFailure, ExecutorContract
from hetero_plugins_mock.executor import MockExecutor
from hetero_plugins_mock.options import MockExecutorOptions


class TestMockExecutorContract(ExecutorContract):
    vocab_size = (
        258  # ctx.vocab_size: the byte tokenizer's, as the engine passes it (the mock draws below 127)
    )

    def make_executor(self, ctx):
        return MockExecutor(ctx)


class Forgiving(MockExecutor):
    """A mock without its own consistency checks (stale slots read as token 0), so that a broken
    subclass returns wrong tokens instead of raising: the contract alone must notice."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.slots = array("q", [0]) * len(self.slots)

    def _check(self, batch):
        pass


class PerRequestCache(Forgiving):
    """Keeps each sequence's tokens by seq_id instead of in the slots the batch names (a classic
    bug: it works until a sequence reads blocks another one wrote, as with prefix caching)."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.private: dict[int, dict[int, int]] = {}

    def execute(self, batch):
        for i, seq_id in enumerate(batch.seq_ids):
            start, end = batch.query_start_loc[i], batch.query_start_loc[i + 1]
            store = self.private.setdefault(seq_id, {})
            store.update(zip(batch.positions[start:end], batch.token_ids[start:end]))
        return super().execute(batch)

    def _next_token(self, batch, i):
        self._reading = batch.seq_ids[i]
        return super()._next_token(batch, i)

    def _read_context(self, block_table, num_tokens):
        store = self.private[self._reading]
        return array("q", [store.get(pos, 0) for pos in range(num_tokens)])


class IgnoresBlockTables(Forgiving):
    """Reads the prompt as if blocks were contiguous from the first one."""

    def _read_context(self, block_table, num_tokens):
        first = block_table[0]
        return super()._read_context([first + i for i in range(len(block_table))], num_tokens)


@pytest.mark.parametrize(
    "broken, test_name, message",
    [
        (
            IgnoresBlockTables,
            "test_block_tables_are_honoured",
            r"block tables are honoured: shuffled, non-contiguous block tables: "
            r"token at \(0, 37\) is \d+, expected",
        ),
        (
            IgnoresBlockTables,
            "test_mixed_prefill_and_decode_batches_match_separate_runs",
            r"a batch gives each sequence the rows it gets alone: mixed prefill \+ decode batches: token at",
        ),
        (
            PerRequestCache,
            "test_slot_writes_land_where_the_batch_says",
            r"slot writes land where the batch says: a sequence reading another's cached blocks: "
            r"token at 37 is",
        ),
    ],
)
def test_the_contract_catches_broken_executors_naming_the_rule_and_the_value(broken, test_name, message):
    class Contract(ExecutorContract):
        vocab_size = 258

        def make_executor(self, ctx):
            return broken(ctx)

    contract = Contract()
    with pytest.raises(ContractFailure, match=message):
        try:
            getattr(contract, test_name)()
        finally:
            contract.teardown_method(None)


def test_the_contract_kit_imports_no_torch():
    code = (
        "import sys; from hetero_core.testing import ExecutorContract; "
        "print('torch' in sys.modules, 'pytest' in sys.modules, 'hypothesis' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "False"]


def test_what_a_wrapped_executor_needs_is_named_when_it_refuses_the_context():
    class TooSmall(ExecutorContract):
        vocab_size = 96  # the mock draws tokens up to its own vocab_size option, 127

        def make_executor(self, ctx):
            return MockExecutor(ctx)

    with pytest.raises(
        RuntimeError,
        match=r"make_executor\(ctx\) raised ConfigError: executor.mock.vocab_size "
        r"\(127\) exceeds the tokenizer's vocabulary \(96\) \(the kit's context: "
        r"vocab_size=96, block_size=16, num_blocks=64, options=None",
    ):
        TooSmall().test_chunked_prefill_matches_unchunked()


class TestMockWithItsOptions(ExecutorContract):
    """``executor_options()`` is the context's ``options``: a smaller mock vocabulary fits the default 96."""

    def executor_options(self):
        return MockExecutorOptions(vocab_size=90, seed=7)

    def make_executor(self, ctx):
        executor = MockExecutor(ctx)
        assert executor.options.seed == 7
        return executor


def test_the_forgiving_mock_itself_passes_so_failures_above_come_from_the_breakage():
    class Contract(ExecutorContract):
        vocab_size = 258

        def make_executor(self, ctx):
            return Forgiving(ctx)

    contract = Contract()
    for name in (
        "test_block_tables_are_honoured",
        "test_mixed_prefill_and_decode_batches_match_separate_runs",
        "test_slot_writes_land_where_the_batch_says",
    ):
        getattr(contract, name)()
    contract.teardown_method(None)
