"""The sampler: greedy, filters, temperature, penalties, logprobs and seeded determinism."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from hetero_core.engine.requests.params import SamplingParams  # noqa: E402
from hetero_core.engine.sampling.logits_processors import (  # noqa: E402
    HEAD_SIZE,
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
)
from hetero_core.engine.sampling.sampler import Sampler, SamplingRow, seeded_uniform  # noqa: E402


def rows_for(params: SamplingParams, n: int, output=()) -> list[SamplingRow]:
    return [SamplingRow(params, [], list(output)) for _ in range(n)]


def draw(logits_row: list[float], params: SamplingParams, n: int = 4000, seed: int = 0) -> list[int]:
    """Sample ``n`` times from one logits row (as one batch of n identical rows)."""
    logits = torch.tensor([logits_row]).repeat(n, 1)
    return Sampler(seed=seed).sample(logits, rows_for(params, n)).token_ids


def frequencies(tokens: list[int], vocab_size: int) -> list[float]:
    return [tokens.count(t) / len(tokens) for t in range(vocab_size)]


def log_probs(probs: list[float]) -> list[float]:
    return [math.log(p) for p in probs]


def test_greedy_is_argmax_in_one_call():
    logits = torch.randn(16, 1000, generator=torch.Generator().manual_seed(1))
    out = Sampler().sample(logits, rows_for(SamplingParams(temperature=0), 16))
    assert out.token_ids == logits.argmax(dim=-1).tolist()
    assert out.logprobs == [None] * 16


def test_empty_batch_and_shape_mismatch():
    assert Sampler().sample(torch.zeros(0, 10), []).token_ids == []
    with pytest.raises(ValueError, match="expected \\[num_rows, vocab_size\\]"):
        Sampler().sample(torch.zeros(3, 10), rows_for(SamplingParams(), 2))


@pytest.mark.parametrize("temperature", [0.3, 1.0, 5.0])
@pytest.mark.parametrize("seed", [None, 7])
def test_top_k_1_is_greedy_at_any_temperature(temperature, seed):
    logits = torch.randn(64, 500, generator=torch.Generator().manual_seed(2))
    params = SamplingParams(temperature=temperature, top_k=1, seed=seed)
    out = Sampler(seed=3).sample(logits, rows_for(params, 64))
    assert out.token_ids == logits.argmax(dim=-1).tolist()


def test_sampling_does_not_modify_the_logits():
    logits = torch.randn(4, 50)
    before = logits.clone()
    params = SamplingParams(top_k=5, top_p=0.5, min_p=0.1, repetition_penalty=1.5, frequency_penalty=1.0)
    Sampler().sample(logits, [SamplingRow(params, [1, 2], [3, 3]) for _ in range(4)])
    assert torch.equal(logits, before)


def test_half_precision_logits():
    logits = torch.randn(4, 50).to(torch.bfloat16)
    out = Sampler(seed=0).sample(logits, rows_for(SamplingParams(top_k=3, logprobs=2), 4))
    assert len(out.token_ids) == 4 and all(lp is not None for lp in out.logprobs)


PROBS = [0.5, 0.3, 0.1, 0.05, 0.05]


@pytest.mark.parametrize(
    "params, allowed",
    [
        (SamplingParams(top_k=3), {0, 1, 2}),
        (SamplingParams(top_p=0.75), {0, 1}),  # 0.5 < 0.75 <= 0.8
        (SamplingParams(top_p=0.85), {0, 1, 2}),
        (SamplingParams(min_p=0.25), {0, 1}),  # keep p >= 0.125
        (SamplingParams(min_p=0.15), {0, 1, 2}),  # keep p >= 0.075
        # top-p renormalises over the top-k survivors: 0.4 / 0.7 >= 0.5 keeps token 0 alone
        (SamplingParams(top_k=2, top_p=0.5), {0}),
    ],
)
def test_filters_never_sample_outside_the_allowed_set(params, allowed):
    probs = [0.4, 0.3, 0.2, 0.1] if params.top_k == 2 else PROBS
    tokens = draw(log_probs(probs), params, n=3000)
    assert set(tokens) == allowed  # every allowed token shows up, nothing else does
    # Survivors keep their relative odds (renormalised).
    mass = sum(probs[t] for t in allowed)
    for t in allowed:
        assert tokens.count(t) / len(tokens) == pytest.approx(probs[t] / mass, abs=0.04)


def test_sampling_matches_the_distribution_chi_square():
    probs = [0.4, 0.3, 0.2, 0.1]
    n = 20000
    tokens = draw(log_probs(probs), SamplingParams(), n=n, seed=11)
    chi2 = sum((tokens.count(t) - n * p) ** 2 / (n * p) for t, p in enumerate(probs))
    assert chi2 < 16.27  # df = 3, p = 0.001


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_sharpens_and_flattens(temperature):
    # Two tokens, logits 0 and 1: P(1) = sigmoid(1 / T).
    tokens = draw([0.0, 1.0], SamplingParams(temperature=temperature), n=8000, seed=5)
    expected = 1 / (1 + math.exp(-1 / temperature))
    sigma = math.sqrt(expected * (1 - expected) / len(tokens))
    assert abs(sum(tokens) / len(tokens) - expected) < 4 * sigma


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -0.5]])
    # token 0 seen in the prompt, tokens 1 and 3 in the output; 2 and 4 unseen
    apply_penalties(logits, [[0]], [[1, 3, 3]], [2.0], [0.0], [0.0])
    assert logits.tolist() == [[1.0, -2.0, 0.5, 1.5, -0.5]]


def test_frequency_and_presence_penalties_use_output_tokens_only():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    apply_penalties(logits, [[0, 2]], [[1, 3, 3]], [1.0], [0.25], [0.5])
    # token 1: -1 - 0.5*1 - 0.25; token 3: 3 - 0.5*2 - 0.25; prompt-only tokens untouched
    assert logits.tolist() == [[2.0, -1.75, 0.5, 1.75]]


def test_penalties_change_what_greedy_picks():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]] * 2)
    plain = SamplingParams(temperature=0)
    penalised = SamplingParams(temperature=0, presence_penalty=0.25, frequency_penalty=0.5)
    rows = [SamplingRow(plain, [0], [1, 3, 3]), SamplingRow(penalised, [0], [1, 3, 3])]
    assert Sampler().sample(logits, rows).token_ids == [3, 0]


def test_penalties_ignore_ids_outside_the_vocab():
    logits = torch.zeros(1, 4)
    apply_penalties(logits, [[7, -1]], [[9]], [2.0], [1.0], [1.0])
    assert logits.tolist() == [[0.0] * 4]


def test_logprobs_are_raw_log_softmax_best_first():
    logits = torch.randn(3, 100, generator=torch.Generator().manual_seed(4))
    expected = logits.log_softmax(dim=-1)
    rows = [
        SamplingRow(SamplingParams(temperature=0.7, top_k=10, logprobs=5, repetition_penalty=1.3), [1], [2]),
        SamplingRow(SamplingParams(temperature=0), [], []),
        SamplingRow(SamplingParams(temperature=0, logprobs=0), [], []),
    ]
    out = Sampler(seed=0).sample(logits, rows)
    first, none, zero = out.logprobs
    assert none is None
    assert first.token_id == out.token_ids[0]
    assert first.logprob == pytest.approx(expected[0, first.token_id].item(), abs=1e-5)
    best = expected[0].topk(5)
    assert [t for t, _ in first.top] == best.indices.tolist()
    assert [v for _, v in first.top] == pytest.approx(best.values.tolist(), abs=1e-5)
    assert zero.top == [] and zero.token_id == out.token_ids[2] == int(logits[2].argmax())
    assert zero.logprob == pytest.approx(expected[2].max().item(), abs=1e-5)


def _reference_top_k_top_p(logits: torch.Tensor, k: int, p: float, margin: float = 0.0):
    """Row by row with a full sort in float64: the textbook definition.

    Returns the filtered logits and a mask of the tokens whose fate depends on rounding: the mass of
    the better tokens lies within ``margin`` of ``p``, so a float32 computation summed in another
    order (another ISA or thread count) may decide either way.
    """
    out = logits.double()
    ambiguous = torch.zeros_like(out, dtype=torch.bool)
    for row, unsure in zip(out, ambiguous):
        order = row.argsort(descending=True)
        if 0 < k < row.numel():
            row[order[k:]] = float("-inf")
        probs = row.softmax(dim=-1)[order]
        before = probs.cumsum(dim=-1) - probs  # mass of the better tokens
        unsure[order[((before - p).abs() <= margin).nonzero().squeeze(1)]] = True
        row[order[(before >= p).nonzero().squeeze(1)]] = float("-inf")
    return out, ambiguous


@pytest.mark.parametrize("vocab_size, scale", [(2000, 0.3), (2000, 3.0), (49152, 1.0)])
@pytest.mark.parametrize("k, p", [(0, 0.9), (0, 0.5), (40, 0.95), (600, 0.99), (5, 1.0)])
def test_head_based_top_k_top_p_matches_full_sort(vocab_size, scale, k, p):
    # scale 0.3 over 2000 tokens is flat: the top-p set is far larger than HEAD_SIZE.
    logits = torch.randn(3, vocab_size, generator=torch.Generator().manual_seed(vocab_size)) * scale
    got = logits.clone()
    apply_top_k_top_p(got, [k] * 3, [p] * 3)
    expected, ambiguous = _reference_top_k_top_p(logits, k, p, margin=1e-5)
    decided = ~ambiguous
    assert torch.equal(got.isinf()[decided], expected.isinf()[decided])
    if (k == 0 and p == 0.9 and scale < 1) or (k == 600 and p == 0.99):
        assert int((~got.isinf()).sum(dim=-1).min()) > HEAD_SIZE


def test_mixed_rows_get_their_own_filters():
    logits = torch.randn(3, 300, generator=torch.Generator().manual_seed(8))
    got = logits.clone()
    apply_top_k_top_p(got, [3, 0, -1], [1.0, 0.5, 1.0])
    assert (~got.isinf()).sum(dim=-1)[0] == 3
    assert torch.equal(got[1].isinf(), _reference_top_k_top_p(logits[1:2], 0, 0.5)[0][0].isinf())
    assert not got[2].isinf().any()
    apply_min_p(got, [0.0, 0.0, 0.0])
    assert not got[2].isinf().any()


def seeded_row(seed: int, num_output: int = 0) -> SamplingRow:
    return SamplingRow(SamplingParams(temperature=1.0, seed=seed), [], list(range(num_output)))


def test_seeded_rows_ignore_their_batch_neighbours_and_position():
    gen = torch.Generator().manual_seed(9)
    target = torch.randn(1, 1000, generator=gen)
    others = torch.randn(5, 1000, generator=gen)
    neighbours = [
        SamplingRow(SamplingParams(), [], []),
        SamplingRow(SamplingParams(temperature=0), [], []),
        SamplingRow(SamplingParams(seed=123, top_p=0.5), [], [1]),
        SamplingRow(SamplingParams(top_k=3, repetition_penalty=1.2), [1, 2], []),
        SamplingRow(SamplingParams(logprobs=2), [], []),
    ]
    for seed in range(20):
        alone = Sampler(seed=1).sample(target, [seeded_row(seed)]).token_ids[0]
        for position in (0, 3, 5):
            logits = torch.cat([others[:position], target, others[position:]])
            rows = neighbours[:position] + [seeded_row(seed)] + neighbours[position:]
            # A different engine generator, too: seeded rows never touch it.
            assert Sampler(seed=position + 100).sample(logits, rows).token_ids[position] == alone


def test_seeded_draws_depend_on_seed_and_step():
    logits = torch.zeros(1, 1000)  # uniform: the token reveals the draw
    tokens_by_seed = {Sampler().sample(logits, [seeded_row(s)]).token_ids[0] for s in range(20)}
    assert len(tokens_by_seed) > 15
    tokens_by_step = {Sampler().sample(logits, [seeded_row(1, n)]).token_ids[0] for n in range(20)}
    assert len(tokens_by_step) > 15
    assert seeded_uniform(1, 5) == seeded_uniform(1, 5) != seeded_uniform(1, 6)


def test_unseeded_rows_are_reproducible_with_a_seeded_sampler():
    logits = torch.randn(8, 500, generator=torch.Generator().manual_seed(10))
    rows = rows_for(SamplingParams(top_p=0.95), 8)

    def run(seed):
        sampler = Sampler(seed=seed)
        return [sampler.sample(logits, rows).token_ids for _ in range(3)]

    assert run(42) == run(42)
    assert run(42) != run(43)


def test_mixed_batch_keeps_greedy_rows_exact():
    logits = torch.randn(6, 400, generator=torch.Generator().manual_seed(12))
    greedy = SamplingParams(temperature=0)
    rows = [SamplingRow(greedy if i % 2 == 0 else SamplingParams(temperature=1.5), [], []) for i in range(6)]
    out = Sampler(seed=0).sample(logits, rows)
    assert out.token_ids[0::2] == logits[0::2].argmax(dim=-1).tolist()


class RecordingTensor(torch.Tensor):
    """A tensor that records the torch functions called on it."""

    calls: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


def test_an_all_greedy_batch_is_one_max():
    logits = torch.randn(32, 1000).as_subclass(RecordingTensor)
    RecordingTensor.calls = []
    out = Sampler().sample(logits, rows_for(SamplingParams(temperature=0), 32))
    calls = [c for c in RecordingTensor.calls if not c.startswith("__")]
    assert calls.count("max") == 1 and "argmax" not in calls and "amax" not in calls
    # the row maxima also check the logits are finite (a broken row's id becomes -1 on the device, so
    # the ids come back in one copy); no copy of the logits, no softmax
    assert set(calls) <= {"dim", "size", "max", "tolist", "isfinite", "masked_fill", "shape"}
    assert calls.count("tolist") == 1
    assert out.token_ids == torch.as_tensor(logits).argmax(dim=-1).tolist()


def test_all_greedy_ties_pick_the_first_index_and_broken_rows_fail_alone():
    logits = torch.zeros(4, 50)
    logits[0, [7, 3, 40]] = 2.0  # a tie: the first index wins, as argmax picks
    logits[1, 11] = float("nan")
    logits[2, 5] = float("inf")
    logits[3] = float("-inf")  # no finite entry
    good = torch.randn(1, 50)
    out = Sampler().sample(torch.cat([logits, good]), rows_for(SamplingParams(temperature=0), 5))
    assert out.token_ids[0] == 3 and out.token_ids[4] == int(good.argmax())
    assert out.errors[0] is None and out.errors[4] is None
    assert all("not finite" in out.errors[i] for i in (1, 2, 3))


def test_a_full_size_batch_with_every_feature_is_fast():
    # 32 rows x SmolLM2's vocab; typically a few ms (tens on a busy 2-core box): the bound only
    # catches per-token Python loops or per-row full sorts.
    import time

    logits = torch.randn(32, 49152, generator=torch.Generator().manual_seed(13))
    params = [
        SamplingParams(top_k=50, top_p=0.9, min_p=0.05, repetition_penalty=1.2, presence_penalty=0.5,
                       frequency_penalty=0.3, logprobs=5, seed=i if i % 2 else None)
        for i in range(32)
    ]  # fmt: skip
    rows = [SamplingRow(p, list(range(i, i + 2000)), list(range(500))) for i, p in enumerate(params)]
    sampler = Sampler(seed=0)
    sampler.sample(logits, rows)
    start = time.perf_counter()
    sampler.sample(logits, rows)
    assert time.perf_counter() - start < 1.0
