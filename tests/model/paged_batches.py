"""Test helper: hand-built paged ``Batch`` objects, with a tiny block allocator.

The same helpers the executor contract kit ships (``hetero_core.testing.paged``), under the names the
model tests use: a ``PagedSequence`` knows all its tokens up front (prompt plus the tokens fed as
"decoded"), so a test can compare each step's logits with one full-sequence HF forward.
"""

from __future__ import annotations

from hetero_core.testing.paged import BlockPool
from hetero_core.testing.paged import ContractSequence as PagedSequence
from hetero_core.testing.paged import build_batch as step

__all__ = ["BlockPool", "PagedSequence", "prompt_logits", "step"]


def prompt_logits(executor, prompt=tuple(range(2, 42))):
    """The logits of one prefill of ``prompt`` (40 tokens by default) on a fresh 64-block pool."""
    seq = PagedSequence(0, list(prompt), len(prompt))
    return executor.execute(step([(seq, len(prompt))], BlockPool(64), 16)).logits
