"""The speculative-decoding summary line of ``hetero run`` (prompts and batch files)."""

from __future__ import annotations

__all__ = ["speculation_line"]


def speculation_line(stats) -> str:
    """Proposed and accepted tokens, acceptance rate and mean accepted length, from ``engine.stats()``."""
    rate, length = stats.spec_acceptance_rate, stats.spec_mean_accepted_length
    return (
        f"--- speculative decoding: {stats.spec_num_draft_tokens} proposed, {stats.spec_num_accepted_tokens} "
        f"accepted ({'-' if rate is None else f'{rate:.0%}'}), mean accepted length "
        f"{'-' if length is None else f'{length:.2f}'} tokens per verifying step"
    )
