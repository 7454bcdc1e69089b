"""The speculative-proposer seam: what the engine calls on a proposer, and what it hands one.

With ``num_speculative_tokens = k > 0`` the engine asks its proposer, once per step and before it
schedules, for up to ``k`` tokens that each decoding sequence will probably generate next
(``propose``); the target model then runs the sequence's last token and those proposals in one
forward pass, and core's sampler keeps the longest prefix it agrees with, plus one token of its own
(``engine/speculation/spec_verify.py``). A proposal is a list of deterministic token ids (a one-hot draft
distribution): for greedy requests a proposed token is kept when it is the target's argmax, for
sampled ones with probability ``p_target(token)``; either way the output has the target's
distribution, whatever the proposer proposes. A bad proposal only costs speed.

A proposer may keep state per sequence (a draft model keeps its own KV cache): ``token_ids`` always
holds every token so far, so a stateful proposer finds its own rollback point by comparing it with
what it has cached; ``release(seq_id)`` says that the sequence is gone (finished, aborted, failed, or
preempted: it may come back later with the same ``seq_id`` and must then be treated as new).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = ["ProposalInput", "Proposer", "ProposerContext"]


@dataclass(frozen=True)
class ProposalInput:
    """One decoding sequence that may speculate this step."""

    seq_id: int  # stable for the life of the request
    token_ids: Sequence[
        int
    ]  # prompt + every generated token so far; the last one is not yet in the target's KV
    num_tokens: int  # how many to propose (>= 1), already capped by max_tokens and max_model_len


@dataclass(frozen=True)
class ProposerContext:
    """What a proposer factory receives."""

    options: Any  # the proposer's validated options model instance, or None
    num_speculative_tokens: int  # k: the most tokens one propose() asks of a sequence
    vocab_size: int  # proposals must lie in [0, vocab_size)
    model_dir: Path | None  # the target's resolved model directory (None for executors without a model)
    executor: str  # the target's executor, by name (a draft model runs on the same kind)
    block_size: int
    max_model_len: int
    max_num_seqs: int  # sequences in one step (max_batch_size): the most inputs one propose() gets
    eos_token_id: int | None = None
    cache_dir: Path | None = (
        None  # where converted models are cached (settings' cache_dir; None: the default)
    )
    # The target's ExecutorContext (hetero_core.executor), for a proposer that runs a model of its own on
    # the same kind of executor (core's draft): its context starts from this one. None in tests and kits.
    target_executor: Any = None


@runtime_checkable
class Proposer(Protocol):
    """Proposes tokens for decoding sequences, one call per engine step."""

    def propose(self, inputs: list[ProposalInput]) -> list[list[int]]:
        """For each input, in order, up to ``num_tokens`` token ids (fewer, or none, when it has no guess)."""
        ...

    def release(self, seq_id: int) -> None:
        """The sequence finished, was aborted or preempted: drop any state kept for it (idempotent)."""
        ...

    def shutdown(self) -> None:
        """The engine is shutting down: free what the proposer holds (a draft model, its cache)."""
        ...
