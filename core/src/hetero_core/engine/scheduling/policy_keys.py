"""The views a policy reads, and the sort keys of a ``SortKeyPolicy`` kept per request.

``view_of(seq)`` is the frozen ``RequestView`` of a sequence now. ``SortKeys`` ranks sequences by a
sort-key policy's ``key(view)`` (ties by arrival) without building a view per request per step:
the first time it asks the key about a request it records which fields the key read. Policies are
deterministic (``SchedulerPolicy.decide``): a key that read only fields that never change for a
request (``STATIC_FIELDS``) gives the same answer every step, so it is kept and the key is not
asked again; a key that read a changing field (token counts, state, preemptions) is asked every
step with a fresh view, as before. A policy whose key depends on anything outside the request
(the clock, its own state) sets ``cache_keys = False`` and is asked every step.
"""

from __future__ import annotations

from dataclasses import fields
from operator import attrgetter

from hetero_core.engine.requests.sequence import Sequence, SequenceStatus
from hetero_core.engine.scheduling.policy import RequestView

__all__ = ["STATIC_FIELDS", "SortKeys", "view_of"]

# RequestView fields that never change while a request is queued or running
STATIC_FIELDS = frozenset(
    {"request_id", "arrival_order", "arrival_time", "priority", "tenant", "num_prompt_tokens", "max_tokens"}
)
_FIELDS = frozenset(f.name for f in fields(RequestView))
_STATE = {
    SequenceStatus.PENDING: "waiting",
    SequenceStatus.PREFILL: "prefill",
    SequenceStatus.DECODE: "decode",
    SequenceStatus.SWAPPED: "swapped",
}
_DYNAMIC = object()  # a request whose key reads a changing field: asked every step
_by_key = attrgetter("policy_key")


def view_of(seq: Sequence, view_type: type[RequestView] = RequestView) -> RequestView:
    return view_type(
        request_id=seq.request_id,
        arrival_order=seq.seq_id,
        arrival_time=seq.arrival_time,
        priority=seq.priority,
        tenant=seq.tenant,
        state=_STATE.get(seq.status, seq.status.value),
        num_prompt_tokens=len(seq.prompt_token_ids),
        num_computed_tokens=seq.num_computed_tokens,
        num_output_tokens=len(seq.output_token_ids),
        num_cached_prefix_tokens=seq.num_cached_tokens,
        max_tokens=seq.params.max_tokens,
        num_preemptions=seq.num_preemptions,
    )


class _RecordingView(RequestView):
    """A ``RequestView`` that notes which of its fields were read."""

    __slots__ = ("fields_read",)

    def __getattribute__(self, name: str):
        if name in _FIELDS:
            try:
                object.__getattribute__(self, "fields_read").add(name)
            except AttributeError:  # a copy made by the key (dataclasses.replace): not recorded
                pass
        return object.__getattribute__(self, name)


class SortKeys:
    """Ranks sequences by ``policy.key``; keys that read only static fields are asked once."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self.cache_keys = bool(getattr(policy, "cache_keys", True))

    def rank(self, seqs: list[Sequence]) -> None:
        """Set ``seq.rank`` for every sequence: its place in key order (ties by arrival). Raises what
        the key raises, or TypeError for keys that do not compare."""
        for seq in seqs:
            cached = seq.policy_key
            if cached is None or cached[0] is not self:
                seq.policy_key = self._first_key(seq)
            elif cached[1] is _DYNAMIC:
                seq.policy_key = (self, _DYNAMIC, (self.policy.key(view_of(seq)), seq.seq_id))
        for i, seq in enumerate(sorted(seqs, key=_sort_value)):
            seq.rank = i

    def _first_key(self, seq: Sequence) -> tuple:
        """``(self, key or _DYNAMIC, (key, arrival))``: the key asked with a recording view."""
        view = view_of(seq, _RecordingView)
        read: set[str] = set()
        object.__setattr__(view, "fields_read", read)
        value = (self.policy.key(view), seq.seq_id)
        is_static = self.cache_keys and read <= STATIC_FIELDS
        return (self, value if is_static else _DYNAMIC, value)


def _sort_value(seq: Sequence):
    return seq.policy_key[2]
