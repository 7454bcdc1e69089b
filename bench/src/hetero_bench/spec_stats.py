"""The engine's speculative-decoding counters, for ``hetero bench spec-decode``."""

from __future__ import annotations

FIELDS = ("spec_num_drafts", "spec_num_draft_tokens", "spec_num_accepted_tokens")


def speculation_counters(llm) -> tuple[int, ...]:
    """(sequence-steps that verified proposals, proposed tokens verified, accepted tokens) since the
    engine started (``engine.stats()``); zeros without speculation."""
    stats = llm.engine.stats()
    return tuple(getattr(stats, name, 0) or 0 for name in FIELDS)
