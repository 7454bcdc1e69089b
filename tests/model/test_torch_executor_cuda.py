"""The torch executor on a CUDA device gives the CPU's logits (GPU machines only)."""

import pytest
import torch

from hetero_core.default_plugins.torch_options import TorchExecutorOptions
from tests.model.paged_batches import BlockPool, PagedSequence, step
from tests.model.tiny_models import hf_logits

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none"),
]
PROMPT = list(range(3, 60))


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_cuda_prefill_and_decode_match_hf(name, tiny_model_dirs, make_executor):
    model_dir, hf_model = tiny_model_dirs[name]
    executor = make_executor(
        model_dir, options=TorchExecutorOptions(device="cuda", dtype="float32")
    )  # auto: bf16 on a GPU
    pool = BlockPool(64, shuffle=True)
    seq = PagedSequence(1, PROMPT[:44], 40)
    expected = hf_logits(hf_model, seq.token_ids)
    logits = executor.execute(step([(seq, 40)], pool, 16)).logits
    assert logits.device.type == "cuda"  # the logits stay on the device: the sampler runs there
    assert (logits[0].cpu() - expected[39]).abs().max() < 1e-3
    for position in range(40, 44):  # decode steps read the paged cache on the GPU
        logits = executor.execute(step([(seq, 1)], pool, 16)).logits
        assert (logits[0].cpu() - expected[position]).abs().max() < 1e-3
