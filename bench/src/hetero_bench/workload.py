"""The offline workload every peer of ``hetero bench offline`` runs: same requests, same rules.

Fixed by a seed: ``num_requests`` prompts of random token ids (lengths uniform in ``prompt_len``,
ids from ``first_token_id`` up, which skips SmolLM2's special tokens), each with its own output
length (uniform in ``output_len``). Every peer decodes greedily and ignores EOS, so it produces
exactly ``max_tokens`` tokens per request; throughput counts only those output tokens.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Request:
    prompt_token_ids: list[int]
    max_tokens: int


@dataclass(frozen=True)
class Workload:
    num_requests: int = 32
    seed: int = 0
    prompt_len: tuple[int, int] = (16, 128)
    output_len: tuple[int, int] = (16, 64)
    first_token_id: int = 100

    def requests(self, vocab_size: int) -> list[Request]:
        """The requests, for a vocabulary of ``vocab_size`` ids (the same as bench/offline_throughput.py
        has always drawn them: prompt length, output length, then the prompt's ids)."""
        rng = random.Random(self.seed)
        result = []
        for _ in range(self.num_requests):
            prompt_len = rng.randint(*self.prompt_len)
            output_len = rng.randint(*self.output_len)
            ids = [rng.randint(self.first_token_id, vocab_size - 1) for _ in range(prompt_len)]
            result.append(Request(ids, output_len))
        return result

    def as_dict(self) -> dict:
        return {**asdict(self), "sampling": "greedy", "ignore_eos": True}
