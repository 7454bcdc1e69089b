"""LogitsExecutor: the mock executor's tokens handed back as logits, so core's sampler (token
constraints, temperature, logprobs) acts on them. Each row is random logits seeded by the mock's token,
with ``margin`` added to that token: a clear best unless a constraint says otherwise."""

from __future__ import annotations

from dataclasses import replace

import torch

from hetero_core.executor import ExecutorOutput


class LogitsExecutor:
    def __init__(self, inner, vocab_size: int, margin: float = 10.0) -> None:
        self.inner, self.vocab_size, self.margin = inner, vocab_size, margin
        self.capabilities = replace(inner.capabilities, vocab_size=vocab_size)  # logits rows this wide

    def execute(self, batch):
        rows = []
        for token in self.inner.execute(batch).token_ids:
            row = torch.randn(self.vocab_size, generator=torch.Generator().manual_seed(token))
            row[token] += self.margin
            rows.append(row)
        return ExecutorOutput(logits=torch.stack(rows))

    def __getattr__(self, name):
        return getattr(self.inner, name)
