"""The torch executor passes core's executor contract, with HF transformers on a tiny random Llama
as the greedy reference."""

from __future__ import annotations

import pytest

from hetero_core.default_plugins.torch_executor import TorchExecutor
from hetero_core.testing import ExecutorContract
from tests.model.tiny_models import VOCAB, hf_logits


def hf_greedy(hf_model, prompt: list[int], num_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(num_tokens):
        tokens.append(int(hf_logits(hf_model, tokens)[-1].argmax()))
    return tokens[len(prompt) :]


class TestTorchExecutorContract(ExecutorContract):
    vocab_size = VOCAB

    @pytest.fixture(autouse=True)
    def _tiny_llama(self, tiny_model_dirs):
        self.model_dir, self.hf_model = tiny_model_dirs["llama"]

    def make_executor(self, ctx):
        return TorchExecutor(ctx)

    def reference_greedy(self, prompt_token_ids, num_tokens):
        return hf_greedy(self.hf_model, prompt_token_ids, num_tokens)


class TestTorchExecutorContractQwen3SmallBlocks(TestTorchExecutorContract):
    """Another architecture and 4-token blocks: every prompt spans many blocks."""

    block_size = 4
    num_blocks = 128

    @pytest.fixture(autouse=True)
    def _tiny_llama(self, tiny_model_dirs):
        self.model_dir, self.hf_model = tiny_model_dirs["qwen3"]


def test_the_contract_catches_an_executor_that_ignores_block_tables(tiny_model_dirs):
    class Contiguous(TorchExecutor):
        """Rewrites every block table as contiguous from its first block (a classic paging bug)."""

        def execute(self, batch):
            tables = [[t[0] + j for j in range(len(t))] for t in batch.block_tables]
            return super().execute(type(batch)(**{**batch.__dict__, "block_tables": tables}))

    class Contract(ExecutorContract):
        vocab_size = VOCAB
        model_dir = tiny_model_dirs["llama"][0]

        def make_executor(self, ctx):
            return Contiguous(ctx)

    contract = Contract()
    try:
        with pytest.raises(AssertionError, match="shuffled, non-contiguous block tables"):
            contract.test_block_tables_are_honoured()
    finally:
        contract.teardown_method(None)
