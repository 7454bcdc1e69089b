"""Sequence: one request's tokens, state and KV block table as it moves through the engine."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from hetero_core.engine.requests.params import SamplingParams
from hetero_core.errors import InvalidRequestError

MAX_TENANT_LENGTH = 256


class SequenceStatus(enum.Enum):
    PENDING = "pending"  # waiting for admission (new, or preempted and waiting to recompute)
    SWAPPED = "swapped"  # preempted with its KV blocks copied to the CPU swap space
    PREFILL = "prefill"  # admitted; prompt (or recompute) tokens still being processed
    DECODE = "decode"  # generating one token per step
    FINISHED = "finished"
    FAILED = "failed"

    @property
    def is_done(self) -> bool:
        return self in (SequenceStatus.FINISHED, SequenceStatus.FAILED)


class FinishReason(enum.Enum):
    LENGTH = "length"
    EOS = "eos"
    STOP = "stop"
    ABORT = "abort"


@dataclass(eq=False)
class Sequence:
    seq_id: int  # arrival order, unique for the engine's lifetime
    request_id: str
    prompt: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list = field(default_factory=list)
    prompt_logprobs: list | None = (
        None  # prompt_logprobs requested: None, then one entry per prompt token so far
    )
    output_text: str = ""
    status: SequenceStatus = SequenceStatus.PENDING
    finish_reason: FinishReason | None = None
    error: str | None = None
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    # Tokens whose K/V are in the cache or written by a step already scheduled (advanced when a step
    # is scheduled, as vLLM v1 does). Of those, ``num_inflight_tokens`` belong to steps not yet
    # completed: their K/V is not confirmed, so they are not named in the prefix cache yet.
    num_computed_tokens: int = 0
    num_inflight_tokens: int = 0
    # Output tokens that scheduled steps will sample and that are not known yet (0 or 1, 2 for a
    # moment with async scheduling): the scheduler plans with them, stop checks wait for them.
    num_pending_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    priority: int = 0  # lower is more urgent (as in vLLM); read by policies
    tenant: str | None = None  # who sent the request (user, team); read by policies
    swap_table: list[int] = field(default_factory=list)  # CPU swap blocks while SWAPPED
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at the last admission
    first_token_time: float | None = None
    finish_time: float | None = None
    grammar: object | None = None  # its structured-output GrammarState (engine.structured_output), or None
    kv_import: object | None = (
        None  # a KVHandoff whose blocks are written when it is admitted (kv_transfer.py)
    )
    export_kv: bool = False  # export the prompt's KV blocks when it finishes (into kv_export)
    kv_export: object | None = None  # the exported KVBlocks
    stream: bool = (
        True  # step() returns its output after every step that advanced it (else only the final one)
    )
    # Speculative decoding: the proposer's tokens for this step (set before scheduling, taken by the
    # scheduler)
    spec_token_ids: tuple[int, ...] = ()
    # Scheduler-owned, per step: the policy's order (lower first); a cached sort key; a copy of the
    # block table that batches share until the table changes; the KV epoch (bumped when a
    # preemption drops the cache, so that a step scheduled before it does not confirm its tokens).
    rank: object = None
    policy_key: object = None
    block_table_copy: list[int] | None = None
    kv_epoch: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def token_ids(self, start: int, end: int) -> list[int]:
        """Prompt + output token ids ``[start, end)`` without building the whole list."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    def token_id(self, index: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[index] if index < n else self.output_token_ids[index - n]

    @property
    def num_scheduled_tokens(self) -> int:
        """Known tokens plus the pending ones: what the scheduler plans with."""
        return len(self.prompt_token_ids) + len(self.output_token_ids) + self.num_pending_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens not yet in the KV cache (the whole prompt at first, then one per decode step)."""
        return self.num_scheduled_tokens - self.num_computed_tokens

    @property
    def num_confirmed_tokens(self) -> int:
        """Computed tokens whose step has completed: what the prefix cache may name."""
        return self.num_computed_tokens - self.num_inflight_tokens

    def reset_for_recompute(self) -> None:
        """After preemption: forget the cache; prompt + outputs are prefilled again later."""
        self.status = SequenceStatus.PENDING
        self.num_computed_tokens = self.num_inflight_tokens = 0
        self.kv_epoch += 1
        self.num_preemptions += 1


def check_priority_and_tenant(priority, tenant) -> None:
    """Raise InvalidRequestError unless ``priority`` is an int and ``tenant`` None or a short string."""
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise InvalidRequestError(f"priority must be an integer (lower runs first), got {priority!r}")
    if tenant is not None and (not isinstance(tenant, str) or not tenant or len(tenant) > MAX_TENANT_LENGTH):
        raise InvalidRequestError(
            f"tenant must be None or a non-empty string of at most {MAX_TENANT_LENGTH} characters, "
            f"got {tenant!r:.80}"
        )
