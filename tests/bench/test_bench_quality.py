"""`hetero bench quantization`'s measures (hetero_bench/quality.py): greedy agreement and its
first-divergence positions, perplexity, the text windows, and the shipped prompts and text."""

from __future__ import annotations

import math

from hetero_bench.quality import (
    agreement,
    first_divergence,
    perplexity,
    quality_prompts,
    quality_text,
    text_windows,
)


def test_first_divergence_is_the_first_differing_index_or_the_common_length():
    assert first_divergence([1, 2, 3], [1, 2, 3]) == 3
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2
    assert first_divergence([4], [5]) == 0


def test_agreement_counts_whole_matches_tokens_before_divergence_and_positions():
    reference = [[1, 2, 3, 4], [1, 2, 3, 4], [9, 9, 9, 9]]
    other = [[1, 2, 3, 4], [1, 2, 0, 4], [0, 9, 9, 9]]
    result = agreement(reference, other)
    assert result["first_divergences"] == [4, 2, 0]
    assert math.isclose(result["match_rate"], 1 / 3)
    assert math.isclose(result["token_agreement"], 6 / 12)  # the 4 after a divergence do not count
    assert math.isclose(result["first_divergence_mean"], 2.0) and result["first_divergence_median"] == 2


def test_perplexity_and_windows():
    assert math.isclose(perplexity([math.log(0.5)] * 4), 2.0)
    assert text_windows(list(range(10)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert text_windows(list(range(9)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # a 1-token tail scores nothing


def test_the_shipped_prompts_and_text():
    prompts = quality_prompts()
    assert len(prompts) == 20 and len(set(prompts)) == 20
    text = quality_text()
    assert 3000 < len(text.encode()) < 8000 and text.isascii() and "Four score and seven years ago" in text
