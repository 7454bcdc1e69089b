"""Logits processors: penalties, temperature and the top-k / top-p / min-p filters.

Each function works on a whole ``[num_rows, vocab_size]`` float32 tensor in place, with one
parameter value per row, so a batch costs a handful of tensor ops whatever its size. Filtered-out
tokens get ``-inf``. The sampler calls them in this order: penalties, temperature, top-k, top-p,
min-p.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import torch


def apply_penalties(
    logits: torch.Tensor,
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
    repetition_penalties: Sequence[float],
    presence_penalties: Sequence[float],
    frequency_penalties: Sequence[float],
) -> None:
    """Penalise tokens already seen, one row of ``logits`` (contiguous) per entry of the sequences.

    - repetition (HF semantics, over prompt and output tokens): a seen token's logit is divided
      by the penalty when positive and multiplied by it when negative;
    - frequency and presence (OpenAI semantics, over output tokens only):
      ``logit -= frequency * count + presence * (count > 0)``.

    Only the seen (row, token) entries are touched: their flat indices come from one tensor of
    all token ids and ``torch.unique``, so the cost follows the number of tokens, not the vocab.
    """
    num_rows, vocab_size = logits.shape
    device, dtype = logits.device, logits.dtype
    flat = logits.view(-1)
    output_index, output_counts = torch.unique(
        flat_token_index(output_token_ids, vocab_size, device), return_counts=True
    )
    repetition = torch.tensor(repetition_penalties, dtype=dtype, device=device)
    if bool((repetition != 1.0).any()):
        prompt_index = flat_token_index(prompt_token_ids, vocab_size, device)
        seen = torch.unique(torch.cat([prompt_index, output_index]))
        scale = repetition[seen // vocab_size]
        values = flat[seen]
        flat[seen] = torch.where(values > 0, values / scale, values * scale)
    frequency = torch.tensor(frequency_penalties, dtype=dtype, device=device)
    presence = torch.tensor(presence_penalties, dtype=dtype, device=device)
    rows = output_index // vocab_size
    flat[output_index] -= frequency[rows] * output_counts.to(dtype) + presence[rows]


def flat_token_index(
    token_ids: Sequence[Sequence[int]], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """``row * vocab_size + token_id`` for every token of every row, as one tensor, built without
    Python loops over tokens. Ids outside ``[0, vocab_size)`` (a tokenizer larger than the
    model's head) are left out.
    """
    lengths = torch.tensor([len(ids) for ids in token_ids], dtype=torch.long, device=device)
    flat = torch.tensor(list(chain.from_iterable(token_ids)), dtype=torch.long, device=device)
    rows = torch.repeat_interleave(torch.arange(len(token_ids), device=device), lengths)
    in_range = (flat >= 0) & (flat < vocab_size)
    return rows[in_range] * vocab_size + flat[in_range]


def apply_temperature(logits: torch.Tensor, temperatures: Sequence[float]) -> None:
    """Divide each row by its temperature (all > 0: greedy rows never get here)."""
    temps = torch.tensor(temperatures, dtype=logits.dtype, device=logits.device)
    logits /= temps.unsqueeze(1)


# The smallest head of best tokens the top-k / top-p filters look at (one ``topk`` per batch).
HEAD_SIZE = 256


def apply_top_k_top_p(logits: torch.Tensor, top_ks: Sequence[int], top_ps: Sequence[float]) -> None:
    """Keep each row's ``top_k`` best tokens (``top_k <= 0``: all), then the smallest set of the
    survivors whose probability mass reaches ``top_p``. The best token always survives; tokens
    tied with the last survivor survive too.

    A full sort of a 49k vocabulary is slow on CPU, so both filters work on a head of each row's
    best tokens, found with one ``topk``: large enough for every top_k, and for every top-p row
    (without top_k) to hold all tokens of probability >= (1 - top_p) / vocab_size. No other token
    can survive top-p: all tokens below that bound weigh less than 1 - top_p together.
    """
    num_rows, vocab_size = logits.shape
    device = logits.device
    ks = [kk if 0 < kk < vocab_size else vocab_size for kk in top_ks]
    any_k, any_p = any(kk < vocab_size for kk in ks), any(pp < 1.0 for pp in top_ps)
    if not (any_k or any_p):
        return
    k = torch.tensor(ks, device=device)
    has_k = k < vocab_size
    p = torch.tensor(top_ps, dtype=logits.dtype, device=device)
    wants_p = p < 1.0
    p_only = wants_p & ~has_k
    any_p_only = any(pp < 1.0 and kk == vocab_size for pp, kk in zip(top_ps, ks))
    log_norm = logits.logsumexp(dim=-1) if any_p_only else None

    head = max([HEAD_SIZE if any_p else 1] + [kk for kk in ks if kk < vocab_size])
    if head < vocab_size and log_norm is not None:
        floor = log_norm + torch.log((1.0 - p) / vocab_size)  # (1 - p) / vocab_size as a logit
        num_candidates = (logits >= floor.unsqueeze(1)).sum(dim=-1)
        head = max(head, int(num_candidates[p_only].max()))
    head = min(head, vocab_size)
    values = logits.topk(head, dim=-1).values  # best first
    last = k.clamp(max=head) - 1  # position of the last top-k survivor in the head
    no_cut = torch.full((num_rows,), float("-inf"), dtype=logits.dtype, device=device)
    threshold = torch.where(has_k, values.gather(1, last.unsqueeze(1)).squeeze(1), no_cut)
    if any_p:
        positions = torch.arange(head, device=device)
        head_logits = values.masked_fill(positions > last.unsqueeze(1), float("-inf"))
        # Top-p renormalises over the top-k survivors, which are all in the head.
        norm = head_logits.logsumexp(dim=-1)
        if log_norm is not None:
            norm = torch.where(has_k, norm, log_norm)
        cumulative = (head_logits - norm.unsqueeze(1)).exp().cumsum(dim=-1)
        cut = (cumulative < p.unsqueeze(1)).sum(dim=-1)  # first position whose mass reaches p
        cut = torch.minimum(cut, last)  # rounding may leave the head's mass a hair short of p
        cut_value = values.gather(1, cut.unsqueeze(1)).squeeze(1)
        threshold = torch.maximum(threshold, torch.where(wants_p, cut_value, no_cut))
    logits.masked_fill_(logits < threshold.unsqueeze(1), float("-inf"))


def apply_min_p(logits: torch.Tensor, min_ps: Sequence[float]) -> None:
    """Drop tokens whose probability is below ``min_p`` times the row's best probability.

    Compared in logit space (``logit < best_logit + log(min_p)``): no softmax needed.
    """
    if not any(p > 0.0 for p in min_ps):
        return
    scale = torch.tensor(min_ps, dtype=logits.dtype, device=logits.device)
    floor = logits.amax(dim=-1) + torch.log(scale)  # log(0) = -inf: the row keeps everything
    logits.masked_fill_(logits < floor.unsqueeze(1), float("-inf"))
