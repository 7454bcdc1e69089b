"""The engine's speculative-decoding counters, for ``hetero bench spec-decode``."""

from __future__ import annotations


def speculation_counters(llm) -> tuple[int, int, int]:
    """(sequence-steps that verified proposals, proposed tokens verified, accepted tokens) since the
    engine started; zeros without speculation."""
    speculation = getattr(llm.engine, "speculation", None)
    if speculation is None:
        return (0, 0, 0)
    stats = speculation.stats()
    return (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens)
