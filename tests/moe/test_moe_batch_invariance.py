"""With the compiled CPU kernels a MoE model's logits for a sequence are the same bits however its
prompt is chunked and whatever shares its steps, in fp32 and bf16: the router, the shared-expert gate
and every expert run in the kernels' linears (a row's result never depends on its batch-mates), and a
token's experts are added in a fixed order."""

from __future__ import annotations

import pytest
import torch

from hetero_core.default_plugins.torch_executor import TorchExecutor
from hetero_core.default_plugins.torch_options import TorchExecutorOptions
from hetero_core.executor import ExecutorContext
from tests.model.paged_batches import BlockPool, PagedSequence, step
from tests.moe.test_moe_models import require_cpu_kernels
from tests.moe.tiny_moe_models import TINY_MOE_MODELS, VOCAB

BLOCK_SIZE, PROMPT, TOTAL = 4, 23, 29


def executor(model_dir, dtype: str) -> TorchExecutor:
    options = TorchExecutorOptions(
        dtype=dtype, cpu_kernels="compiled", prepared_weights_cache=False, amx_linears=False
    )
    return TorchExecutor(
        ExecutorContext(
            settings=None,
            options=options,
            model_dir=model_dir,
            num_blocks=128,
            block_size=BLOCK_SIZE,
            max_model_len=256,
            max_num_batched_tokens=256,
            max_num_seqs=8,
            eos_token_id=None,
            vocab_size=0,
        )
    )


def run(model_dir, dtype: str, chunk: int, with_others: bool) -> dict[int, torch.Tensor]:
    """Logits of sequence 0 at each position from PROMPT - 1 on, its prompt fed ``chunk`` tokens a step."""
    tokens = torch.randint(2, VOCAB, (TOTAL,), generator=torch.Generator().manual_seed(3)).tolist()
    other_tokens = torch.randint(2, VOCAB, (TOTAL,), generator=torch.Generator().manual_seed(4)).tolist()
    seq, other = PagedSequence(0, tokens, PROMPT), PagedSequence(1, other_tokens, 11)
    ex, pool, logits = executor(model_dir, dtype), BlockPool(128, shuffle=True, seed=1), {}
    try:
        while seq.num_computed < TOTAL:
            n = min(chunk, PROMPT - seq.num_computed) if seq.num_computed < PROMPT else 1
            work = [(seq, n)]
            if with_others and other.num_computed < TOTAL:
                work.append((other, 11 if other.num_computed == 0 else 1))
            sampled = seq.num_computed + n >= PROMPT  # then its row is the first sampled one
            out = ex.execute(step(work, pool, BLOCK_SIZE)).logits
            if sampled:
                logits[seq.num_computed - 1] = out[0].clone()
    finally:
        ex.shutdown()
    return logits


@pytest.mark.parametrize("name", list(TINY_MOE_MODELS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_logits_do_not_depend_on_chunking_or_batch_mates(name, dtype, tiny_moe_dirs):
    require_cpu_kernels()
    model_dir = tiny_moe_dirs[name][0]
    alone = run(model_dir, dtype, chunk=PROMPT, with_others=False)
    mixed = run(model_dir, dtype, chunk=5, with_others=True)
    assert alone.keys() == mixed.keys() and len(alone) == TOTAL - PROMPT + 1
    for position in alone:
        assert torch.equal(alone[position], mixed[position]), f"position {position}"
