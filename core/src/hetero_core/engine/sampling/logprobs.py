"""TokenLogprobs: the logprobs of one generated token, also readable as vLLM's ``dict[int, Logprob]``.

Hetero's shape is ``.token_id``, ``.logprob`` and ``.top`` (``(token_id, logprob)`` pairs, best
first). vLLM code reads a position's logprobs as a mapping from token id to ``Logprob(logprob, rank,
decoded_token)``, holding the sampled token and the top ones: ``lp[token_id].logprob``,
``lp.items()``. Both work on the same object. ``rank`` is the place among the top ones (1: best),
None for a sampled token outside them; ``decoded_token`` is None (decode the id when needed).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class TokenLogprobs:
    """Logprobs (log_softmax of the raw model logits) of the sampled token and the top n."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), best first; len == params.logprobs

    def as_dict(self) -> dict[int, Logprob]:
        """vLLM's form: the sampled token first, then the top ones."""
        ranks = {token_id: rank for rank, (token_id, _) in enumerate(self.top, start=1)}
        entries = {self.token_id: Logprob(self.logprob, ranks.get(self.token_id))}
        for token_id, logprob in self.top:
            entries.setdefault(token_id, Logprob(logprob, ranks[token_id]))
        return entries

    def __getitem__(self, token_id: int) -> Logprob:
        return self.as_dict()[token_id]

    def __contains__(self, token_id: object) -> bool:
        return token_id in self.as_dict()

    def __iter__(self) -> Iterator[int]:
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())

    def keys(self):
        return self.as_dict().keys()

    def values(self):
        return self.as_dict().values()

    def items(self):
        return self.as_dict().items()
