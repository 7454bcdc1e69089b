"""The mock executor passes core's executor contract (its reference: its own determinism)."""

from __future__ import annotations

import subprocess
import sys
from array import array

import pytest

from hetero_core.testing import ExecutorContract
from hetero_plugins_mock.executor import MockExecutor


class TestMockExecutorContract(ExecutorContract):
    vocab_size = 258  # the byte tokenizer's; the mock draws below 127

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
    "broken, test_name",
    [
        (IgnoresBlockTables, "test_block_tables_are_honoured"),
        (IgnoresBlockTables, "test_mixed_prefill_and_decode_batches_match_separate_runs"),
        (PerRequestCache, "test_slot_writes_land_where_the_batch_says"),
    ],
)
def test_the_contract_catches_broken_executors(broken, test_name):
    class Contract(ExecutorContract):
        vocab_size = 258

        def make_executor(self, ctx):
            return broken(ctx)

    contract = Contract()
    with pytest.raises(AssertionError):
        try:
            getattr(contract, test_name)()
        finally:
            contract.teardown_method(None)


def test_the_contract_kit_imports_no_torch():
    code = "import sys, hetero_core.testing; print('torch' in sys.modules, 'pytest' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_the_forgiving_mock_itself_passes_so_failures_above_come_from_the_breakage():
    class Contract(ExecutorContract):
        vocab_size = 258

        def make_executor(self, ctx):
            return Forgiving(ctx)

    contract = Contract()
    for name in ("test_block_tables_are_honoured", "test_mixed_prefill_and_decode_batches_match_separate_runs",
                 "test_slot_writes_land_where_the_batch_says"):
        getattr(contract, name)()
    contract.teardown_method(None)
