"""The router's arithmetic, without Ray: which replica holds the fewest queued tokens.

Each replica reports its engine's queued tokens (``EngineStats.num_queued_tokens``: prompt + remaining
output tokens of its unfinished requests) with the wall-clock time of the report; Ray Serve's controller
collects the reports every ``request_routing_stats_period_s`` and hands them to every router. Between
reports a router adds what it sent since: an estimate of each request it routed after the replica's
latest report and that has not finished. So a burst of requests spreads out at once instead of piling
onto whichever replica looked idle at the last report.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

QUEUED_TOKENS_KEY = "num_queued_tokens"
REPORT_TIME_KEY = "reported_at"
CHARS_PER_TOKEN = 4  # a prompt sent as text is estimated at this many characters per token


def estimate_request_tokens(prompt, max_tokens: int | None) -> int:
    """What a request adds to a replica's queue before the replica has tokenized it: prompt tokens
    (exact for token ids, ``CHARS_PER_TOKEN`` characters each for text or chat messages) + ``max_tokens``."""
    if isinstance(prompt, str):
        num_prompt = -(-len(prompt) // CHARS_PER_TOKEN)
    elif prompt and all(isinstance(m, dict) for m in prompt):
        num_prompt = -(-sum(len(str(m.get("content") or "")) for m in prompt) // CHARS_PER_TOKEN)
    else:
        num_prompt = len(prompt or ())
    return max(1, num_prompt) + (max_tokens or 0)


@dataclass
class _Sent:
    replica: object
    sent_at: float
    num_tokens: int


@dataclass
class QueuedTokensLedger:
    """The latest report of each replica and the requests sent since. Replicas are any hashable ids."""

    reports: dict = field(default_factory=dict)  # replica -> (queued tokens, reported_at)
    sent: dict = field(default_factory=dict)  # request id -> _Sent (one replica per request)

    def report(self, replica, stats: dict | None) -> None:
        """Take a replica's routing stats; requests sent to it before the report are counted in it."""
        if not stats or QUEUED_TOKENS_KEY not in stats:
            return
        reported_at = float(stats.get(REPORT_TIME_KEY, 0.0))
        self.reports[replica] = (int(stats[QUEUED_TOKENS_KEY]), reported_at)
        for request_id in [r for r, s in self.sent.items() if s.replica == replica and s.sent_at <= reported_at]:
            del self.sent[request_id]

    def record_sent(self, replica, request_id, num_tokens: int, now: float) -> None:
        """The request goes to ``replica`` (moving it there if an earlier choice was refused)."""
        self.sent[request_id] = _Sent(replica, now, num_tokens)

    def record_finished(self, replica, request_id) -> None:
        if request_id in self.sent and self.sent[request_id].replica == replica:
            del self.sent[request_id]

    def forget(self, replica) -> None:
        """The replica is gone (died or removed)."""
        self.reports.pop(replica, None)
        for request_id in [r for r, s in self.sent.items() if s.replica == replica]:
            del self.sent[request_id]

    def queued_tokens(self, replica) -> int:
        reported = self.reports.get(replica, (0, 0.0))[0]
        return reported + sum(s.num_tokens for s in self.sent.values() if s.replica == replica)

    def rank(self, replicas: list, rng: random.Random | None = None) -> list:
        """``replicas`` from fewest to most queued tokens; ties in random order, so equal replicas
        share the work instead of the first one taking it all."""
        rng = rng or random
        keyed = [(self.queued_tokens(r), rng.random(), i) for i, r in enumerate(replicas)]
        return [replicas[i] for _, _, i in sorted(keyed)]
