"""Verification of proposed tokens (speculative decoding): which proposals the target keeps, and its
own next token.

A sampled sequence with ``n`` proposals ``x_1..x_n`` has ``n + 1`` output rows: the target's
prediction after its last known token and after each proposal. Proposals are deterministic ids (a
one-hot draft distribution ``q``), so the rejection rule of Leviathan et al. / Chen et al.
(accept ``x`` with probability ``min(1, p(x) / q(x))``) becomes: accept ``x_j`` with probability
``p_j(x_j)``; on the first rejection, draw from ``p_j`` with ``x_j`` removed and renormalised
(``max(0, p - q)`` normalised); if all ``n`` are kept, draw the bonus token from ``p_{n+1}``. The
tokens then have exactly the target's distribution, whatever was proposed. ``p`` is the request's
distribution after its temperature, top-k, top-p and min-p (``logits_processors``, as the sampler
applies them). Greedy requests keep a proposal iff it is the row's argmax, and the first argmax that
differs (or the last row's) is the next token: token for token the output without speculation.

Draws: a seeded request's uniforms come from ``(seed, output index, purpose)`` alone, so it is
reproducible run to run; unseeded ones from the sampler's generator. Rows without proposals (and
every feature that does not speculate: ``engine/speculation/speculation.py``) go through the sampler as usual.
Executors that return token ids are verified by exact match with their id at each position.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import torch

from hetero_core.engine.sampling.logits_processors import apply_min_p, apply_temperature, apply_top_k_top_p
from hetero_core.engine.sampling.sampler import NON_FINITE_LOGITS, Sampler, SamplingRow

__all__ = ["rejection_sample", "target_probs", "verify_logits", "verify_token_ids"]
Verified = list[
    tuple[list[int], object, str | None]
]  # per sampled row: (kept tokens + its own, logprobs, error)


def verify_token_ids(token_ids: list[int], specs: list[tuple[int, ...]], vocab_size: int) -> Verified:
    """Exact match of each proposal with the executor's id at its position."""
    out, row = [], 0
    for spec in specs:
        ids = token_ids[row : row + 1 + len(spec)]
        row += 1 + len(spec)
        kept = 0
        while kept < len(spec) and ids[kept] == spec[kept]:
            kept += 1
        tokens = list(spec[:kept]) + [ids[kept]]
        bad = tokens[-1]
        error = None
        if not (isinstance(bad, int) and not isinstance(bad, bool) and 0 <= bad < vocab_size):
            error = f"the executor returned token id {bad!r}, outside the vocabulary [0, {vocab_size})"
        out.append((tokens, None, error))
    return out


def verify_logits(
    sampler: Sampler,
    logits: torch.Tensor,
    rows: list[SamplingRow],
    specs: list[tuple[int, ...]],
    token_bitmask=None,
) -> Verified:
    """Tokens for each sampled row from ``logits`` (``sum(1 + len(spec))`` rows, per row in order)."""
    expected = sum(1 + len(spec) for spec in specs)
    if logits.dim() != 2 or logits.shape[0] != expected:
        raise ValueError(
            f"verification got logits of shape {tuple(logits.shape)} for {len(specs)} sampled "
            f"sequences with {expected - len(specs)} proposals; expected [{expected}, vocab_size]"
        )
    starts = [0]
    for spec in specs:
        starts.append(starts[-1] + 1 + len(spec))
    out: Verified = [([], None, None)] * len(specs)
    plain = [i for i, spec in enumerate(specs) if not spec]
    if plain:  # no proposals: the sampler, with every feature it has
        index = torch.tensor([starts[i] for i in plain], device=logits.device)
        mask = None if token_bitmask is None else token_bitmask[torch.tensor(plain)]
        result = sampler.sample(logits.index_select(0, index), [rows[i] for i in plain], token_bitmask=mask)
        for j, i in enumerate(plain):
            out[i] = ([result.token_ids[j]], result.logprobs[j], result.error(j))
    greedy = [i for i, spec in enumerate(specs) if spec and rows[i].params.is_greedy]
    if greedy:  # every greedy row at once: one max and one copy to the host (one sync on a GPU)
        index = torch.tensor(
            [r for i in greedy for r in range(starts[i], starts[i + 1])], device=logits.device
        )
        best, argmax = logits.index_select(0, index).max(dim=-1)  # the first maximal index, as the sampler's
        argmax = argmax.masked_fill(~torch.isfinite(best), -1).tolist()
        offset = 0
        for i in greedy:
            ids = argmax[offset : offset + 1 + len(specs[i])]
            offset += len(ids)
            out[i] = ([0], None, NON_FINITE_LOGITS) if -1 in ids else (_greedy(ids, specs[i]), None, None)
    for i in (i for i, spec in enumerate(specs) if spec and not rows[i].params.is_greedy):
        block = logits[starts[i] : starts[i + 1]].float()
        if not bool(torch.isfinite(block.amax(dim=-1)).all()):
            out[i] = ([0], None, NON_FINITE_LOGITS)
            continue
        params = rows[i].params
        draw = _uniforms(params.seed, len(rows[i].output_token_ids), sampler.rng)
        out[i] = (rejection_sample(target_probs(block.clone(), params), specs[i], draw), None, None)
    return out


def _greedy(argmax: list[int], spec: Sequence[int]) -> list[int]:
    kept = 0
    while kept < len(spec) and argmax[kept] == spec[kept]:
        kept += 1
    return list(spec[:kept]) + [argmax[kept]]


def target_probs(block: torch.Tensor, params) -> torch.Tensor:
    """The request's sampling distribution at each row of ``block`` (fp32 logits, modified in place)."""
    num_rows = block.shape[0]
    apply_temperature(block, [params.temperature] * num_rows)
    apply_top_k_top_p(block, [params.top_k] * num_rows, [params.top_p] * num_rows)
    apply_min_p(block, [params.min_p] * num_rows)
    return block.softmax(dim=-1)


def rejection_sample(
    probs: torch.Tensor, spec: Sequence[int], uniform: Callable[[int, str], float]
) -> list[int]:
    """The kept proposals and one token of the target's: ``probs`` [len(spec) + 1, vocab] (rows sum
    to 1); ``uniform(j, purpose)`` a number in [0, 1) for output ``j`` of this step."""
    chosen = probs[torch.arange(len(spec)), torch.tensor(spec, dtype=torch.long)].tolist()
    tokens: list[int] = []
    for j, (token, p) in enumerate(zip(spec, chosen)):
        if uniform(j, "accept") < p:
            tokens.append(token)
            continue
        residual = probs[j].clone()
        residual[token] = 0.0  # p - q for a one-hot q, then renormalised by the draw
        tokens.append(_draw(residual, uniform(j, "draw")))
        return tokens
    tokens.append(_draw(probs[len(spec)], uniform(len(spec), "draw")))
    return tokens


def _draw(weights: torch.Tensor, u: float) -> int:
    """Inverse CDF over non-negative ``weights`` (not necessarily normalised); never a zero weight."""
    cdf = weights.cumsum(dim=0)
    total = cdf[-1:]
    index = torch.searchsorted(cdf, total * u, right=True)
    last = torch.searchsorted(cdf, total, right=False)  # u * total rounding up to total
    return int(torch.minimum(index, last).item())


def _uniforms(seed: int | None, num_output_tokens: int, rng: random.Random) -> Callable[[int, str], float]:
    if seed is None:
        return lambda j, purpose: rng.random()
    return lambda j, purpose: random.Random(f"hetero-spec/{seed}/{num_output_tokens + j}/{purpose}").random()
