"""The cuda executor passes core's executor contract on the flash-attn test double (CPU fp32 here,
CUDA on a GPU machine), with HF transformers on a tiny random Llama as the greedy reference."""

from __future__ import annotations

import pytest

from hetero_core.testing import ExecutorContract
from hetero_plugins_cuda.executor import CudaExecutor
from hetero_plugins_cuda.options import CudaExecutorOptions
from tests.cuda.flash_attn_double import FlashAttnDouble
from tests.model.tiny_models import VOCAB, hf_logits


def hf_greedy(hf_model, prompt, num_tokens):
    tokens = list(prompt)
    for _ in range(num_tokens):
        tokens.append(int(hf_logits(hf_model, tokens)[-1].argmax()))
    return tokens[len(prompt) :]


class TestCudaExecutorContract(ExecutorContract):
    vocab_size = VOCAB
    cuda_graphs = True

    @pytest.fixture(autouse=True)
    def _tiny_llama(self, tiny_dirs):
        self.model_dir, self.hf_model = tiny_dirs["llama"]

    def make_executor(self, ctx):
        import torch

        double = FlashAttnDouble(
            page_block_multiple=16, dtypes=(torch.float32, torch.float16, torch.bfloat16)
        )
        options = CudaExecutorOptions(device="cpu", dtype="float32", cuda_graphs=self.cuda_graphs)
        return CudaExecutor(ctx, options, kernels=double.kernels())

    def reference_greedy(self, prompt_token_ids, num_tokens):
        return hf_greedy(self.hf_model, prompt_token_ids, num_tokens)


class TestCudaExecutorContractEager(TestCudaExecutorContract):
    cuda_graphs = False
