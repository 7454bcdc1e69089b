"""The Triton executor passes core's executor contract: on the CPU through Triton's interpreter (tiny
shapes, since it is slow), compiled on a GPU; HF transformers on a tiny random Llama is the greedy
reference."""

from __future__ import annotations

import pytest

from hetero_core.testing import ExecutorContract
from hetero_plugins_triton.executor import create_triton_executor
from hetero_plugins_triton.options import TritonExecutorOptions
from tests.model.tiny_models import VOCAB, hf_logits, save_tiny_model


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    directory = tmp_path_factory.mktemp("triton_contract") / "llama"
    return directory, save_tiny_model("llama", directory)


class TestTritonExecutorContract(ExecutorContract):
    vocab_size = VOCAB
    prompt_lengths = (20, 5, 3)  # the first spans two blocks
    num_fed_tokens = 2
    prefill_chunk = 6
    num_greedy_tokens = 3

    @pytest.fixture(autouse=True)
    def _setup(self, tiny_llama, mode):
        (self.model_dir, self.hf_model), self.interpret = tiny_llama, mode.interpret

    def make_executor(self, ctx):
        options = TritonExecutorOptions(
            interpreter=self.interpret,
            dtype="float32",
            decode_block_n=16,
            prefill_block_m=16,
            prefill_block_n=16,
        )
        return create_triton_executor(type(ctx)(**{**ctx.__dict__, "options": options}))

    def reference_greedy(self, prompt_token_ids, num_tokens):
        tokens = list(prompt_token_ids)
        for _ in range(num_tokens):
            tokens.append(int(hf_logits(self.hf_model, tokens)[-1].argmax()))
        return tokens[len(prompt_token_ids) :]
