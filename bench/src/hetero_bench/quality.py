"""Output quality of an engine against a reference engine: greedy agreement over a fixed prompt set
(the share of prompts whose tokens all match, the share of tokens before each prompt's first
divergence, the first-divergence positions) and perplexity on a shipped text (``data/``: public-domain
English, the Declaration of Independence, the Gettysburg Address, two famous novel openings)."""

from __future__ import annotations

import math
import statistics
from importlib.resources import files

DATA = files("hetero_bench") / "data"


def quality_prompts() -> list[str]:
    """The fixed prompt set (20 prompts, one a line)."""
    return [line for line in (DATA / "quality_prompts.txt").read_text().splitlines() if line.strip()]


def quality_text() -> str:
    """The shipped text perplexity is measured on (~4 KB of plain English)."""
    return (DATA / "quality_text.txt").read_text()


def first_divergence(reference: list[int], other: list[int]) -> int:
    """The index of the first token where ``other`` differs from ``reference`` (their common length
    when one is a prefix of the other, or both are equal)."""
    for index, (a, b) in enumerate(zip(reference, other)):
        if a != b:
            return index
    return min(len(reference), len(other))


def agreement(reference: list[list[int]], other: list[list[int]]) -> dict:
    """Greedy agreement of ``other`` with ``reference`` (token ids per prompt, same prompts):
    ``match_rate`` (prompts whose tokens all equal), ``token_agreement`` (tokens before the first
    divergence over all tokens), ``first_divergence_mean`` / ``_median`` (a prompt that never
    diverges counts its length)."""
    positions = [first_divergence(a, b) for a, b in zip(reference, other, strict=True)]
    total = sum(len(a) for a in reference)
    return {
        "match_rate": sum(p == len(a) and len(a) == len(b) for p, a, b in zip(positions, reference, other))
        / len(reference),
        "token_agreement": sum(positions) / total if total else 1.0,
        "first_divergence_mean": statistics.fmean(positions),
        "first_divergence_median": statistics.median(positions),
        "first_divergences": positions,
    }


def perplexity(logprobs: list[float]) -> float:
    """exp of the mean negative log-likelihood of the tokens."""
    return math.exp(-statistics.fmean(logprobs))


def text_windows(token_ids: list[int], window: int) -> list[list[int]]:
    """``token_ids`` cut into consecutive windows of ``window`` tokens (the last may be shorter; one of
    fewer than 2 tokens is dropped: it scores nothing)."""
    windows = [token_ids[i : i + window] for i in range(0, len(token_ids), window)]
    return [w for w in windows if len(w) >= 2]
