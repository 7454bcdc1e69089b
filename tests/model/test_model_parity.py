"""Our model + torch paged backend give the HF implementation's logits, prefill and decode."""

from __future__ import annotations

import pytest
import torch

from tests.model.paged_batches import BlockPool, PagedSequence, step
from tests.model.tiny_models import TINY_MODELS, VOCAB, hf_logits

TOL = 1e-4
BLOCK_SIZE = 16


def random_tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("name", list(TINY_MODELS))
@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered_blocks", "shuffled_blocks"])
def test_prefill_then_decode_matches_hf(name, shuffle, tiny_model_dirs, make_executor):
    model_dir, hf_model = tiny_model_dirs[name]
    executor = make_executor(model_dir, block_size=BLOCK_SIZE)
    num_prompt, num_decode = 37, 12  # the sequence crosses three blocks; decode crosses a boundary
    tokens = random_tokens(num_prompt + num_decode, seed=1)
    expected = hf_logits(hf_model, tokens)
    seq = PagedSequence(seq_id=7, token_ids=tokens, num_prompt_tokens=num_prompt)
    pool = BlockPool(64, shuffle=shuffle)

    logits = executor.execute(step([(seq, num_prompt)], pool, BLOCK_SIZE)).logits
    assert logits.shape == (1, VOCAB) and logits.dtype == torch.float32
    assert (logits[0] - expected[num_prompt - 1]).abs().max() < TOL

    for pos in range(num_prompt, num_prompt + num_decode):
        logits = executor.execute(step([(seq, 1)], pool, BLOCK_SIZE)).logits
        assert (logits[0] - expected[pos]).abs().max() < TOL, f"decode at position {pos}"
    if shuffle:
        assert seq.block_table != sorted(seq.block_table)


def test_block_size_one_and_odd_sizes(tiny_model_dirs, make_executor):
    model_dir, hf_model = tiny_model_dirs["llama"]
    tokens = random_tokens(21, seed=2)
    expected = hf_logits(hf_model, tokens)
    for block_size in (1, 5):
        executor = make_executor(model_dir, num_blocks=32, block_size=block_size)
        seq, pool = PagedSequence(0, tokens, num_prompt_tokens=19), BlockPool(32, shuffle=True)
        first = executor.execute(step([(seq, 19)], pool, block_size)).logits[0]
        second = executor.execute(step([(seq, 1)], pool, block_size)).logits[0]
        assert (first - expected[18]).abs().max() < TOL
        assert (second - expected[19]).abs().max() < TOL
