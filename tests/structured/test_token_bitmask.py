"""The packed token bitmask (xgrammar's layout) and the sampler applying it to a batch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hetero_core import SamplingParams  # noqa: E402
from hetero_core.engine.sampling.sampler import Sampler, SamplingRow  # noqa: E402
from hetero_core.engine.sampling.token_bitmask import (  # noqa: E402
    allocate_token_bitmask,
    allowed_token_ids,
    unpack_token_bitmask,
)


def only(bitmask, row: int, tokens: list[int]) -> None:
    bitmask[row] = 0
    for t in tokens:
        word = int(bitmask[row, t // 32]) & 0xFFFFFFFF | (1 << (t % 32))
        bitmask[row, t // 32] = word - (1 << 32) if word >= 1 << 31 else word


def test_pack_and_unpack_agree():
    bitmask = allocate_token_bitmask(2, 70)
    only(bitmask, 0, [0, 31, 32, 63, 69])
    assert allowed_token_ids(bitmask[0]) == [0, 31, 32, 63, 69]
    assert allowed_token_ids(bitmask[1]) == list(range(96))  # every bit of the last word, too
    allowed = unpack_token_bitmask(bitmask, 70)
    assert allowed.shape == (2, 70) and allowed[0].nonzero().flatten().tolist() == [0, 31, 32, 63, 69]
    assert unpack_token_bitmask(bitmask, 100)[1, 96:].any().item() is False  # beyond the mask: forbidden


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.8, seed=3),
        SamplingParams(temperature=0, repetition_penalty=1.3, logprobs=2),
    ],
)
def test_the_sampler_takes_only_allowed_tokens_and_leaves_other_rows_alone(params):
    logits = torch.randn(3, 100, generator=torch.Generator().manual_seed(0))
    rows = [SamplingRow(params, [1, 2], [3]) for _ in range(3)]
    free = Sampler(seed=0).sample(logits, rows)
    bitmask = allocate_token_bitmask(3, 100)
    only(bitmask, 1, [7, 42])
    masked = Sampler(seed=0).sample(logits, rows, token_bitmask=bitmask)
    assert masked.token_ids[1] in (7, 42)
    assert masked.token_ids[0] == free.token_ids[0] and masked.token_ids[2] == free.token_ids[2]
    if params.logprobs:  # logprobs stay those of the raw logits, finite
        assert masked.logprobs[1].top == free.logprobs[1].top


def test_a_row_with_nothing_allowed_fails_alone():
    logits = torch.zeros(2, 40)
    bitmask = allocate_token_bitmask(2, 40)
    bitmask[0] = 0
    out = Sampler().sample(
        logits, [SamplingRow(SamplingParams(temperature=0), [], [])] * 2, token_bitmask=bitmask
    )
    assert "allows no token" in out.error(0) and out.error(1) is None


def test_a_complete_grammar_lets_eos_through_min_tokens_and_a_contradiction_names_the_fields():
    logits = torch.zeros(2, 40)
    bitmask = allocate_token_bitmask(2, 40)
    only(bitmask, 0, [7])  # the grammar is complete: only EOS (7) may come
    only(bitmask, 1, [3])  # the grammar needs token 3, which allowed_token_ids leaves out
    rows = [
        SamplingRow(SamplingParams(temperature=0, min_tokens=5, max_tokens=10), [], []),
        SamplingRow(SamplingParams(temperature=0, allowed_token_ids=[4, 5]), [], []),
    ]
    out = Sampler(eos_token_id=7).sample(logits, rows, token_bitmask=bitmask)
    assert out.token_ids[0] == 7 and out.error(0) is None
    assert "allowed_token_ids" in out.error(1) and "executor" not in out.error(1)
