"""Token constraints: what a request forbids or favours, applied to a batch's logits before sampling.

vLLM's order and meaning, on the ``[num_rows, vocab_size]`` float32 scores, in place, before
penalties and temperature (so they bind greedy rows too):

1. ``allowed_token_ids``: every other token gets ``-inf``;
2. ``bad_words`` (as ``bad_words_token_ids``): a one-token word is always banned; a longer one
   bans its last token when the output ends with its other tokens;
3. ``min_tokens``: while the output is shorter, EOS (unless ``ignore_eos``) and ``stop_token_ids``
   are banned;
4. ``logit_bias``: each bias is added to its token's logit.

A batch costs a few index operations whatever its size: the banned and biased (row, token) entries
of every row are gathered into one flat index each (``flat_token_index``). Rows without constraints
cost nothing. Logprobs stay those of the raw model logits (the sampler computes them apart).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hetero_core.engine.sampling.logits_processors import flat_token_index


def apply_token_constraints(scores: torch.Tensor, rows: Sequence, eos_token_id: int | None) -> None:
    """Apply each row's constraints (``rows[i].params``; ``rows[i].output_token_ids``) to ``scores``."""
    picked = [i for i, row in enumerate(rows) if row.params.has_token_constraints]
    if not picked:
        return
    num_rows, vocab_size = scores.shape
    device = scores.device
    _apply_allowed(scores, rows, picked)
    banned: list[list[int]] = [[] for _ in range(num_rows)]
    biased: list[list[int]] = [[] for _ in range(num_rows)]
    biases: list[float] = []
    for i in picked:
        params, output = rows[i].params, rows[i].output_token_ids
        banned[i] += banned_words(params.bad_words_token_ids, output)
        if len(output) < params.min_tokens:
            banned[i] += [t for t in params.stop_token_ids if t < vocab_size]  # others cannot be sampled
            if eos_token_id is not None and not params.ignore_eos:
                banned[i].append(eos_token_id)
        for token_id, bias in params.logit_bias or ():
            if token_id < vocab_size:
                biased[i].append(token_id)
                biases.append(bias)
    flat = scores.view(-1)
    if any(banned):
        flat[flat_token_index(banned, vocab_size, device)] = float("-inf")
    if biases:
        values = torch.tensor(biases, dtype=scores.dtype, device=device)
        flat.index_add_(0, flat_token_index(biased, vocab_size, device), values)


def banned_words(words: Sequence[Sequence[int]], output: Sequence[int]) -> list[int]:
    """The last token of each word whose other tokens end ``output``."""
    banned = []
    for word in words:
        head = len(word) - 1
        if head == 0 or (head <= len(output) and list(output[len(output) - head :]) == list(word[:head])):
            banned.append(word[-1])
    return banned


def _apply_allowed(scores: torch.Tensor, rows: Sequence, picked: list[int]) -> None:
    limited = [i for i in picked if rows[i].params.allowed_token_ids is not None]
    if not limited:
        return
    num_rows, vocab_size = scores.shape
    allowed: list[Sequence[int]] = [()] * num_rows
    for i in limited:
        allowed[i] = rows[i].params.allowed_token_ids
    keep = torch.zeros(num_rows * vocab_size, dtype=torch.bool, device=scores.device)
    keep[flat_token_index(allowed, vocab_size, scores.device)] = True
    keep = keep.view(num_rows, vocab_size)
    keep[[i for i in range(num_rows) if i not in set(limited)]] = True
    scores.masked_fill_(~keep, float("-inf"))
