"""SchedulerStats: what ``engine.stats()`` returns, one frozen object built from counters.

Counters since the engine started (steps, preemptions, prefix-cache tokens, policy problems) and the
state after the last step (queues, blocks, the last step's batch, the queued tokens). Every field is a
counter kept up to date as things happen, never a recount: reading it costs the same at 1 or 1000
requests. ``hetero run`` prints it; ``AsyncLLM`` publishes it (``EngineStats``) after every step.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SchedulerStats"]


@dataclass(frozen=True)
class SchedulerStats:
    # counters since the engine started
    num_steps: int  # scheduling passes (a step that scheduled nothing may take two)
    num_preemptions: int
    num_recompute_preemptions: int
    num_swap_preemptions: int
    num_swap_ins: int
    prefix_cache_queried_tokens: int  # tokens of admitted requests looked up in the prefix cache
    prefix_cache_hit_tokens: int  # of which served from it
    num_invalid_policy_decisions: int  # decisions refused (that step ran in arrival order)
    num_policy_hold_back_overrides: int  # steps whose hold-backs were ignored: nothing ran, all held back
    # the state after the last step
    num_running: int
    num_waiting: int
    num_swapped: int
    num_blocks: int  # the KV pool
    num_free_blocks: int
    num_cached_blocks: int  # blocks a new request could reuse from the prefix cache
    last_step_num_seqs: int  # sequences in the last step's batch (0: it ran nothing)
    last_step_num_tokens: int  # tokens in the last step's batch
    num_queued_tokens: int  # prompt + output tokens still to come, over the unfinished requests
    # speculative decoding (counters since the start; 0 while it is off):
    # ``engine/speculation/speculation.py``
    spec_num_drafts: int = 0  # sequence-steps that verified proposals
    spec_num_draft_tokens: int = 0  # proposed tokens verified
    spec_num_accepted_tokens: int = 0  # of which the target kept

    @property
    def spec_acceptance_rate(self) -> float | None:
        """Kept / verified proposals (None before any was verified)."""
        return (
            self.spec_num_accepted_tokens / self.spec_num_draft_tokens if self.spec_num_draft_tokens else None
        )

    @property
    def spec_mean_accepted_length(self) -> float | None:
        """Tokens per verifying sequence-step: the kept proposals plus the target's own token."""
        return 1 + self.spec_num_accepted_tokens / self.spec_num_drafts if self.spec_num_drafts else None

    @property
    def prefix_cache_hit_rate(self) -> float:
        return (
            self.prefix_cache_hit_tokens / self.prefix_cache_queried_tokens
            if self.prefix_cache_queried_tokens
            else 0.0
        )
