"""Parallel sampling: ``SamplingParams(n=...)`` / ``best_of``, one request answered by several completions.

A request of ``best_of`` (else ``n``) completions runs as that many child sequences, ids
``"{index}_{request_id}"`` as in vLLM, each with ``n=1`` and, when the request is seeded, seed
``seed + index`` (so two seeded completions differ, and each is reproducible). They share the prompt's
KV blocks through the prefix cache: only the first child is queued at first; once it has computed
the prompt (its first token is out, or it ended), the others are queued and find the prompt's full
blocks in the prefix cache (the scheduler takes them with a reference each, ``allocate_slots``), so
each recomputes at most the prompt's last, partial block. Without a prefix cache (the setting
``enable_prefix_caching=false``, the ``contiguous`` allocator), or for a prompt no longer than a
block (nothing to share), every child is queued at once and prefills the prompt itself.

``step()`` reports the children as one ``RequestOutput`` of the parent id (``merge``): ``outputs``
holds a completion per child, finished when every child has ended. With ``best_of > n`` the children
draw logprobs (for ranking, hidden unless the request asked for them) and the ``n`` completions of
best cumulative logprob are returned, best first. A child that fails sets the parent's ``error``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from hetero_core.engine.requests.outputs import CompletionOutput, RequestOutput
from hetero_core.engine.requests.params import SamplingParams

__all__ = ["ParallelRequest", "ParallelRequests", "child_params", "child_request_id"]


def child_request_id(request_id: str, index: int) -> str:
    return f"{index}_{request_id}"


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """One completion's parameters: ``n=1``, seed + index, logprobs drawn when best_of must rank."""
    seed = params.seed + index if params.seed is not None else None
    ranks = params.num_samples > params.n
    logprobs = 0 if ranks and params.logprobs is None else params.logprobs
    return replace(params, n=1, best_of=None, seed=seed, logprobs=logprobs)


@dataclass
class ParallelRequest:
    """One request's child sequences (with their detokenizers) and their latest outputs."""

    request_id: str
    params: SamplingParams
    children: list[tuple]  # (Sequence, IncrementalDetokenizer) per completion, in index order
    share_prompt: bool  # the others wait for the first to compute the prompt, then share its blocks
    num_queued: int = 0  # children handed to the scheduler (the first ones)
    latest: list[RequestOutput | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.latest = [None] * len(self.children)

    def to_queue(self) -> list[tuple]:
        """The children to queue now: the first at once; the rest once the first computed the prompt
        (or all at once when there is no prefix cache to share it through)."""
        if self.num_queued == len(self.children):
            return []
        first = self.children[0][0]
        if self.num_queued == 0 and self.share_prompt:
            count = 1
        elif self.num_queued == 0 or first.output_token_ids or first.status.is_done:
            count = len(self.children)
        else:
            return []
        chosen = [c for c in self.children[self.num_queued : count] if not c[0].status.is_done]
        self.num_queued = count
        return chosen

    @property
    def is_done(self) -> bool:
        return all(out is not None and out.finished for out in self.latest)

    def output(self) -> RequestOutput:
        """The parent's output from its children's latest ones."""
        done = self.is_done
        ranked = [(i, out) for i, out in enumerate(self.latest) if out is not None]
        if done and len(self.children) > self.params.n:
            ranked.sort(key=lambda item: _score(item[1]), reverse=True)
        ranked = ranked[: self.params.n]
        completions = [self._completion(position, out) for position, (_, out) in enumerate(ranked)]
        completions += [
            CompletionOutput(i, "", [], None, None, None) for i in range(len(completions), self.params.n)
        ]
        first = ranked[0][1]
        seen = [out for out in self.latest if out is not None]
        errors = [out.error for out in seen if out.error]
        first_tokens = [out.first_token_time for out in seen if out.first_token_time is not None]
        return replace(
            first,
            request_id=self.request_id,
            output_token_ids=completions[0].token_ids,
            text=completions[0].text,
            logprobs=completions[0].logprobs,
            finished=done,
            finish_reason=first.finish_reason if done else None,
            error=errors[0] if errors and done else None,
            num_preemptions=sum(out.num_preemptions for out in seen),
            first_token_time=min(first_tokens) if first_tokens else None,
            finish_time=max(out.finish_time or 0.0 for out in seen) if done else None,
            outputs=completions,
            num_cached_tokens=sum(out.num_cached_tokens for out in seen),
        )

    def _completion(self, index: int, out: RequestOutput) -> CompletionOutput:
        completion = replace(out.outputs[0], index=index)
        if self.params.logprobs is None:  # drawn for ranking only
            completion = replace(completion, logprobs=None)
        return completion


def _score(out: RequestOutput) -> float:
    logprob = out.outputs[0].cumulative_logprob
    return -math.inf if logprob is None or out.error else logprob


class ParallelRequests:
    """The engine's requests with more than one completion, by parent id and by child id."""

    def __init__(self) -> None:
        self._by_id: dict[str, ParallelRequest] = {}
        self._by_child: dict[str, tuple[ParallelRequest, int]] = {}

    def __contains__(self, request_id: object) -> bool:
        return isinstance(request_id, str) and request_id in self._by_id

    def __bool__(self) -> bool:
        return bool(self._by_id)

    def owns(self, request_id: str) -> bool:
        """Whether a parent or child request holds this id."""
        return request_id in self._by_id or request_id in self._by_child

    def get(self, request_id: str) -> ParallelRequest | None:
        return self._by_id.get(request_id)

    def add(self, group: ParallelRequest) -> None:
        self._by_id[group.request_id] = group
        for index, (seq, _) in enumerate(group.children):
            self._by_child[seq.request_id] = (group, index)

    def to_queue(self) -> list[tuple]:
        """Children whose turn to be queued has come (``ParallelRequest.to_queue``)."""
        return [child for group in self._by_id.values() for child in group.to_queue()]

    def merge(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Children's outputs replaced by their parent's, in the place of the first; a finished
        parent is forgotten."""
        if not self._by_child:
            return outputs
        merged: list = []
        places: dict[str, int] = {}
        for out in outputs:
            entry = self._by_child.get(out.request_id)
            if entry is None:
                merged.append(out)
                continue
            group, index = entry
            group.latest[index] = out
            if group.request_id not in places:
                places[group.request_id] = len(merged)
                merged.append(None)
        for request_id, place in places.items():
            group = self._by_id[request_id]
            merged[place] = group.output()
            if group.is_done:
                del self._by_id[request_id]
                for seq, _ in group.children:
                    self._by_child.pop(seq.request_id, None)
        return merged
